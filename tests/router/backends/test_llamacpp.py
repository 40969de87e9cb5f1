"""The llama.cpp engine on a tiny GGUF pair the tests write themselves (router/backends/tiny_gguf.py): the GGUF
holds the torch model's numbers, the loop's primitives (logits at every position, rollback, hidden states) and
generate are exact against llama.cpp's own greedy decoding. In CI llama-cpp-python is installed by the test
command (scripts/setup.sh) and these tests must run; elsewhere they skip when it is missing."""

import os

import pytest
import torch

if os.environ.get("CI") != "true":
    pytest.importorskip("llama_cpp")

from router.decoding import generate  # noqa: E402
from router.loop.baselines import generate_autoregressive  # noqa: E402
from router.loop.layout import Layout  # noqa: E402
from router.backends.llamacpp import LlamaCppLM  # noqa: E402
from router.backends.llamacpp_backend import tiny_gguf_pair  # noqa: E402
from router.pair import tiny_pair  # noqa: E402

SEED = 2


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return tiny_gguf_pair(tmp_path_factory.mktemp("gguf"), SEED)


@pytest.fixture(scope="module")
def pair(paths):
    return LlamaCppLM(paths[0], n_threads=1), LlamaCppLM(paths[1], n_threads=1)


def _prompts():
    return torch.tensor([[5, 17, 33, 41, 8, 60, 61], [9, 3, 4, 5, 6, 7, 70]])


def test_the_gguf_holds_the_torch_models_numbers(pair):
    """Teacher-forced logits and final hidden states at every position of a prompt, from one decode: llama.cpp
    on the GGUF against torch on the model (float32 both; measured 0.0049 and 0.00097 at most)."""
    _, verifier = pair
    _, torch_verifier, _ = tiny_pair(SEED)
    ids = _prompts()[:1]
    with torch.inference_mode():
        want = torch_verifier(ids, output_hidden_states=True)
    cache = verifier.kv_cache(verifier.vocab_size)
    cache.want_hidden = True
    got = cache.feed(Layout(ids, torch.ones_like(ids)), ids.shape[1], keep=ids.shape[1])[0]  # (T, V)
    assert torch.equal(got.argmax(-1), want.logits[0].argmax(-1))
    assert (got - want.logits[0]).abs().max() < 0.02
    assert (cache.last_hidden[0] - want.hidden_states[-1][0]).abs().max() < 0.005


def llama_greedy(path, prompt: list[int], n: int) -> list[int]:
    """llama.cpp's own greedy decoding (its high-level API, top-k 1), the reference for exactness."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=256, n_threads=1, verbose=False)
    out = []
    for token in llm.generate(prompt, top_k=1, temp=0.0, repeat_penalty=1.0):
        if token == 2 or len(out) == n:
            break
        out.append(token)
    return out


def test_lossless_and_drafter_decode_as_llama_cpp_itself(pair, paths):
    """Greedy `lossless` is the verifier's own greedy decoding and `drafter` the drafter's, token for token, in a
    batch of two rows that accept different numbers of drafts (rollback by llama_memory_seq_rm per row)."""
    drafter, verifier = pair
    ids = _prompts()
    out = generate(drafter, verifier, ids, rule="lossless", gamma=4, max_new_tokens=24)
    alone = generate_autoregressive(verifier, ids, max_new_tokens=24)
    assert torch.equal(out.sequences, alone.sequences)
    assert out.stats["rejections"] > 0  # drafts were rolled back, or the comparison would be vacuous
    for b in range(2):
        new = [t for t in out.sequences[b, ids.shape[1] :].tolist() if t != 0]
        assert new[: len(new)] == llama_greedy(paths[1], ids[b].tolist(), len(new))[: len(new)]
    mine = generate(drafter, verifier, ids, rule="drafter", gamma=4, max_new_tokens=16)
    own = generate_autoregressive(drafter, ids, max_new_tokens=16)
    assert torch.equal(mine.sequences, own.sequences)


def test_every_rule_and_the_hidden_states_run_on_llama_cpp(pair):
    drafter, verifier = pair
    ids = _prompts()
    for rule in ("opt", "token_v2", "kl_gate", "lossy"):
        out = generate(drafter, verifier, ids, rule=rule, alpha=0.3, gamma=4, temperature=1.0, max_new_tokens=12)
        assert out.stats["new_tokens"] > 0
    cache = verifier.kv_cache(verifier.vocab_size)
    cache.want_hidden = True
    cache.feed(Layout(ids, torch.ones_like(ids)), ids.shape[1], keep=3)
    assert cache.last_hidden.shape == (2, 3, verifier.hidden_size) and cache.last_hidden.abs().sum() > 0


def _fresh_logits(lm, rows: list[list[int]]) -> torch.Tensor:
    """Last-position logits (B, V) of each row decoded from scratch in a new context."""
    ids = torch.tensor(rows)
    return lm.kv_cache(lm.vocab_size).feed(Layout(ids, torch.ones_like(ids)), ids.shape[1], keep=1)[:, 0]


def test_rollback_and_dropped_rows_leave_exactly_the_kept_tokens(pair):
    """Row 0 keeps 1 of 3 drafts, row 1 all 3, row 2 none; then row 1 leaves the batch. The next feed's logits
    are those of each row's kept tokens decoded from scratch (same argmax; llama.cpp's numbers depend a little
    on how a batch is split: here at most 0.0027, against more than 0.05 had the rejected drafts stayed)."""
    _, verifier = pair
    prompts = [[5, 17, 33, 41], [9, 3, 4, 5], [70, 71, 72, 73]]
    ids = torch.tensor(prompts)
    layout, cache = Layout(ids, torch.ones_like(ids)), verifier.kv_cache(verifier.vocab_size)
    cache.feed(layout, layout.length, keep=1)
    start = layout.length
    layout.append(torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32]]))
    cache.feed(layout, layout.length, keep=3)
    layout.keep_first(start, torch.tensor([1, 3, 0]))
    layout.append(torch.tensor([[40], [41], [42]]))
    got = cache.feed(layout, layout.length, keep=1)[:, 0]
    kept = [prompts[0] + [10, 40], prompts[1] + [20, 21, 22, 41], prompts[2] + [42]]
    for b in range(3):
        want = _fresh_logits(verifier, [kept[b]])[0]
        assert got[b].argmax() == want.argmax() and (got[b] - want).abs().max() < 0.01
    stale = _fresh_logits(verifier, [prompts[0] + [10, 11, 12, 40]])[0]  # had the rejected drafts stayed
    assert (got[0] - stale).abs().max() > 0.05
    rows = torch.tensor([0, 2])
    layout.select_rows(rows)
    cache.select_rows(rows)
    layout.append(torch.tensor([[50], [52]]))
    got = cache.feed(layout, layout.length, keep=1)[:, 0]
    for i, b in enumerate((0, 2)):
        want = _fresh_logits(verifier, [kept[b] + [50 if b == 0 else 52]])[0]
        assert got[i].argmax() == want.argmax() and (got[i] - want).abs().max() < 0.01


def test_the_sampler_on_llama_cpp_draws_pi(pair):
    """At temperature 1 the first new token of `lossless` follows the verifier's distribution (chi-square over
    250 rows of one prompt), as the torch loop's does."""
    from scipy.stats import chisquare

    drafter, verifier = pair
    n, prompt = 250, [5, 17, 33, 41, 8]
    ids = torch.tensor([prompt] * n)
    out = generate(drafter, verifier, ids, rule="lossless", gamma=3, temperature=1.0, max_new_tokens=1, seed=5)
    p = _fresh_logits(verifier, [prompt])[0].double().softmax(-1)  # float64: the expected counts sum to n
    top = p.argsort(descending=True)[:8]
    first = out.sequences[:, len(prompt)]
    observed = [int((first == t).sum()) for t in top] + [int((~torch.isin(first, top)).sum())]
    expected = [float(p[t]) * n for t in top] + [float(1 - p[top].sum()) * n]
    assert chisquare(observed, expected).pvalue > 1e-3


def test_eval_decodes_online_on_llama_cpp_from_torch_records(tmp_path, capsys, monkeypatch):
    """`specroute eval engine=llamacpp` on records the torch tiny pair made: the online points decode the same
    weights written as GGUF in llama.cpp (said in one note), verifier, drafter and a router trained on them included."""
    import json

    from specroute import cli

    monkeypatch.setenv("SPECROUTE_CACHE", str(tmp_path / "cache"))  # the tiny GGUF pair is written there
    rec = tmp_path / "records"
    assert cli.main(["gen", "--config", "configs/gen/tiny.yaml", f"output={rec}", "max_examples=16"]) == 0
    rtr = tmp_path / "router"
    train = ["train", "--config", "configs/train/tiny.yaml", f"records=[{rec}]", f"output={rtr}", "max_epochs=1"]
    assert cli.main([*train, "baselines=false"]) == 0
    args = [
        "eval",
        "--config",
        "configs/eval/tiny.yaml",
        f"records=[{rec}]",
        f"routers=[{rtr}]",
        f"output={tmp_path / 'e'}",
    ]
    args += ["max_prompts=2", "max_new_tokens=6", "online_methods=[opt,router,token_cascade]", "engine=llamacpp"]
    args += ["threads=1"]
    assert cli.main(args) == 0
    assert "decoding on llama.cpp (1 threads) the GGUF files" in capsys.readouterr().err
    points = json.loads((tmp_path / "e" / "metrics.json").read_text())["online"]["points"]
    assert {p["method"] for p in points} >= {"verifier", "drafter", "opt", "router", "token_cascade"}
    assert all(p["seconds_per_token"] > 0 and p["tokens"] > 0 for p in points)
    report = (tmp_path / "e" / "report.md").read_text()
    assert "kernels) with 1 threads (as set" in report and "reused as a complete set" not in report  # timed here
    # prompts sharing a few-shot-like context: llama.cpp keeps it in its contexts (no torch cache is made), and
    # the verifier's outputs equal plain llama.cpp decoding of each whole prompt
    from router.loop.baselines import generate_autoregressive
    from router.pair import load_pair
    from router.records import read_heldout

    context = "Question: Tom has 3 apples and buys 4 more. Answer: 3 + 4 = 7. So the answer is 7.\n\n"
    rows = [{**e, "prompt": context + e["question"][:100]} for e in read_heldout(rec)[:2]]  # < 256 tiny tokens
    prompts = tmp_path / "shared.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli.main([*args, f"output={tmp_path / 'shared'}", f"prompts={prompts}", "online_methods=[opt]"]) == 0
    online = json.loads((tmp_path / "shared" / "metrics.json").read_text())["online"]
    assert online["shared_prefix"]["tokens"] >= 32 and online["shared_prefix"]["seconds"] > 0
    pair = load_pair("tiny:drafter", "tiny:verifier", engine="llamacpp", threads=1)
    point = json.loads(next((tmp_path / "shared" / "online").glob("verifier@*.json")).read_text())
    for row, decoded in zip(rows, point["examples"]):
        ids = torch.tensor([pair.tokenizer.encode(row["prompt"], add_special_tokens=False)])
        plain = generate_autoregressive(pair.verifier, ids, max_new_tokens=6, role="verifier")
        assert decoded["new_ids"] == plain.sequences[0, ids.shape[1] :].tolist()[: len(decoded["new_ids"])]


def test_the_generate_command_decodes_on_llama_cpp(tmp_path, capsys, monkeypatch):
    """`specroute generate --engine llamacpp --threads 1`: tokens, the engine and threads in the summary, and
    the verifier-only comparison on the same engine."""
    import json

    from specroute import cli

    monkeypatch.setenv("SPECROUTE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "g.json"
    args = ["generate", "--prompt", "the cat sat on", "--drafter", "tiny:drafter", "--verifier", "tiny:verifier"]
    args += ["--engine", "llamacpp", "--threads", "1", "--rule", "token_v2", "--alpha", "0.5"]
    assert cli.main([*args, "--max-new-tokens", "12", "--compare", "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    assert len(result["tokens"]) == 12 and result["stats"]["rule"] == "token_v2"
    assert "kernels), 1 threads" in capsys.readouterr().out


@pytest.mark.slow
def test_the_embedded_pair_on_llama_cpp_ends_where_llama_cpp_ends_a_generation():
    """Every token llama.cpp calls end-of-generation ends a row, <|endoftext|> included: the 1.5B coder
    writes it after a few-shot answer, and with the GGUF's EOS id alone (<|im_end|>) rows went on into a
    new conversation whose numbers the GSM8K metric (the output's final number) then read."""
    from router.infra.embedded import embedded_gguf, embedded_installed

    if not embedded_installed():
        pytest.skip("the embedded pair is not installed")
    verifier = LlamaCppLM(embedded_gguf("verifier"), n_threads=1)
    ends = set(verifier.generation_config.eos_token_id)
    assert {151643, 151645} <= ends  # <|endoftext|>, <|im_end|>
    lib, vocab = verifier._lib, verifier._lib.llama_model_get_vocab(verifier.model)
    assert ends == {i for i in range(verifier.vocab_size) if lib.llama_vocab_is_eog(vocab, i)}


def test_the_answer_so_far_is_carried_on_llama_cpp(pair):
    """A running policy on llama.cpp (the lag carry, bonus positions resolved from the next block's first drafter
    forward) sees, before each block, as many summed positions as the answer has emitted so far."""
    from helpers import RunningProbe

    drafter, verifier = pair
    probe = RunningProbe()
    ids = _prompts()[:1]
    out = generate(drafter, verifier, ids, rule=probe, gamma=3, max_new_tokens=16)
    emitted = out.sequences[0, ids.shape[1] :].tolist()
    start, bonus = 0, 0
    for drafts, before, _ in probe.seen:
        assert int(before.count[0]) == start and torch.isfinite(before.sums).all()
        g = drafts.shape[1]
        n = next((j for j in range(g) if start + j >= len(emitted) or drafts[0, j] != emitted[start + j]), g)
        bonus += int(n == g)
        start += n + 1
    assert len(probe.seen) >= 3 and bonus >= 1  # some block followed a bonus position


def test_a_shared_prefix_is_readied_in_a_kept_context_before_any_batch(pair):
    """SharedPrefix.ready on llama.cpp decodes the prefix into a context the model keeps (timed in the prefix's
    seconds); the first batch starting from it leases that context and decodes only its rows' remainders, and its
    tokens equal plain decoding of the whole prompts."""
    from router.loop.prefix import SharedPrefix

    _, verifier = pair
    head = list(range(3, 43))  # 40 shared tokens
    prompts = torch.tensor([head + [60, 61], head + [70, 71]])
    prefix = SharedPrefix.common(prompts.tolist())
    verifier.release(verifier.lease(64))  # a kept context without the prefix: ready must put it there
    prefix.ready(verifier)
    assert prefix.seconds > 0 and verifier._free[0].prefix == tuple(head)
    readied = verifier._free[0]
    decoded = []
    original = readied.decode
    readied.decode = lambda entries, *a: decoded.append(len(entries)) or original(entries, *a)
    try:
        cached = generate_autoregressive(verifier, prompts, max_new_tokens=4, role="verifier", prefix=prefix)
    finally:
        readied.decode = original
    assert decoded and decoded[0] == 2 * 2  # the first decode: two remainder tokens per row, no prefix
    plain = generate_autoregressive(verifier, prompts, max_new_tokens=4, role="verifier")
    assert cached.sequences.tolist() == plain.sequences.tolist()
