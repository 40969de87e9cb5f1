"""llama.cpp's own speculative decoding as a baseline (eval/llamacpp_speculative.py): its log read back
(counts, decode timer, the continuation after the prompt's echo), the error when the tool is not built,
and, where scripts/build_llamacpp_tools.sh has built it, a real run on the tiny GGUF pair: greedy, so the
continuation is the verifier's own greedy decoding."""

import os
import stat

import pytest

from eval.llamacpp_speculative import SpeculativeRun, continuation, find_tool, parse_output

STDERR = """
encoded   42 tokens in    0.512 seconds, speed:   82.031 t/s
decoded   65 tokens in    2.250 seconds, speed:   28.889 t/s

n_draft   = 4
n_predict = 65
n_drafted = 60
n_accept  = 45
accept    = 75.000%
"""


def test_the_log_is_read_back():
    prompt = "Question: What is 2 + 3?\nAnswer:"
    run = parse_output("\n\n" + prompt + " 2 + 3 = 5. So the answer is 5.\n\n\n\n", STDERR, prompt)
    assert run == SpeculativeRun(" 2 + 3 = 5. So the answer is 5.", 65, 2.25, 60, 45)
    assert run.tokens_per_block == pytest.approx(65 / 20)  # 20 verifications: 65 tokens less 45 accepted drafts


def test_the_continuation_starts_after_the_echo_not_at_a_repeat():
    prompt = "Question: a\nAnswer: b\n\nQuestion: c\nAnswer:"
    # the continuation repeats the prompt's end: the echo (the first occurrence near the start) is the cut
    assert continuation("\n\n" + prompt + " d\n\n" + prompt + " e", prompt) == " d\n\n" + prompt + " e"
    with pytest.raises(RuntimeError, match="does not echo"):
        continuation("something else entirely", prompt)


def test_a_log_without_timer_is_a_clear_error():
    with pytest.raises(RuntimeError, match="decoded N tokens"):
        parse_output("text", "no timer here", "text")


def test_a_missing_tool_names_the_build_script(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECROUTE_LLAMACPP_TOOLS", str(tmp_path))
    monkeypatch.setattr("eval.llamacpp_speculative.TOOLS_DIR", tmp_path / "none")
    with pytest.raises(SystemExit, match="build_llamacpp_tools.sh"):
        find_tool()
    tool = tmp_path / "llama-speculative-simple"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    assert find_tool() == tool


def _built_tool():
    try:
        return find_tool()
    except SystemExit:
        return None


@pytest.mark.skipif(
    _built_tool() is None, reason="llama-speculative-simple not built (scripts/build_llamacpp_tools.sh)"
)
def test_the_tool_decodes_the_tiny_pair_greedily(tmp_path):
    """On the tiny GGUF pair (float32 both): its continuation is llama.cpp's own greedy decoding of the
    verifier, token for token, and its counts add up."""
    if os.environ.get("CI") != "true":
        pytest.importorskip("llama_cpp")
    from eval.llamacpp_speculative import run_speculative
    from router.loop.tiny import BYTE_OFFSET
    from router.backends.llamacpp_backend import tiny_gguf_pair
    from tests.test_llamacpp import llama_greedy

    drafter, verifier = tiny_gguf_pair(tmp_path, 2)
    prompt = "abcdefg"  # no spaces: the tiny tokenizer would print them back as "▁"
    run = run_speculative(_built_tool(), verifier, drafter, prompt, 12, draft_max=4, threads=1)
    assert run.tokens >= 12 and run.seconds > 0 and 0 < run.accepted <= run.drafted
    from llama_cpp import Llama

    # the prompt's tokens as the tool makes them (its tokenizer call), then llama.cpp's own greedy decoding
    ids = Llama(model_path=str(verifier), n_ctx=64, verbose=False, vocab_only=True).tokenize(
        prompt.encode(), True, True
    )
    want = llama_greedy(verifier, ids, 12)
    got = [b + BYTE_OFFSET for b in run.text.encode("utf-8", "surrogateescape")][: len(want)]
    assert len(want) == 12 and got == want  # 12 tokens, no end of text before them (seed 2 does not stop)


AVX2_FLAGS = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma bmi2 avx2"
AVX512_FLAGS = AVX2_FLAGS + " avx512f avx512dq avx512cd avx512bw avx512vl avx512vbmi avx512_vnni avx512_bf16"


@pytest.mark.parametrize(
    "flags, variant",
    [(AVX2_FLAGS, "avx2"), (AVX512_FLAGS, "avx512"), (AVX512_FLAGS.replace(" avx512_bf16", ""), "avx2")],
)
def test_the_build_is_chosen_from_the_cpus_flags(tmp_path, flags, variant):
    """scripts/llamacpp.sh (setup.sh's llama-cpp-python wheel and the tools' build): AVX-512 kernels only
    where the CPU has every extension they use, AMX never (ggml's AMX path crashes on Q4_K_M)."""
    import subprocess
    from pathlib import Path

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    script = Path(__file__).resolve().parents[2] / "scripts" / "llamacpp.sh"
    shell = f'source "{script}"; v=$(llamacpp_variant); echo $v; llamacpp_cmake_args $v'
    done = subprocess.run(
        ["bash", "-c", shell], capture_output=True, text=True, env={"SPECROUTE_CPUINFO": str(cpuinfo)}
    )
    chosen, args = done.stdout.splitlines()
    assert chosen == variant and "-DGGML_NATIVE=OFF" in args and "-DGGML_AVX2=ON" in args
    assert ("-DGGML_AVX512=ON" in args) == (variant == "avx512")
    assert "-DGGML_AMX_INT8=ON" not in args


def test_the_engine_note_names_the_builds_kernels():
    if os.environ.get("CI") != "true":
        pytest.importorskip("llama_cpp")
    from router.backends.llamacpp_lib import kernels

    assert kernels().split("+")[0] in ("AVX512", "AVX2", "AVX", "SSE3", "generic")
