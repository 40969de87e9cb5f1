"""`vllm serve` with specroute's plugin on: the OpenAI-compatible server started on 127.0.0.1 with the tiny pair,
completion and chat requests through the `openai` client, outputs checked against specroute's loop (given vLLM's
prefill token, as tests/vllm_plugin/test_vllm_engine.py explains), a request's own policy, a bad one refused with HTTP
400; the server is stopped when the test ends."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the vLLM tests run in .venv-vllm (bash scripts/setup.sh vllm)")

from test_vllm_engine import GAMMA, _specroute  # noqa: E402  (the same reference decode)

from router.loop.tiny import save_tiny_pair  # noqa: E402
from router.pair import load_pair  # noqa: E402

RULE, ALPHA = "token_v2", 0.4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`vllm serve` on the tiny pair with the plugin (token_v2), until the module's tests end."""
    folder = tmp_path_factory.mktemp("served")
    drafter, verifier = save_tiny_pair(folder / "pair", hidden=128)
    port = _free_port()
    spec = json.dumps({"method": "draft_model", "model": str(drafter), "num_speculative_tokens": GAMMA})
    argv = [
        str(Path(sys.executable).parent / "vllm"),
        "serve",
        str(verifier),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    argv += [
        "--dtype",
        "float32",
        "--max-model-len",
        "512",
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        str(256 << 20),
    ]
    argv += ["--speculative-config", spec, "--served-model-name", "tiny"]
    env = {
        **os.environ,
        "SPECROUTE_POLICY": RULE,
        "SPECROUTE_ALPHA": str(ALPHA),
        "SPECROUTE_STATS": str(folder / "counts.json"),
    }
    log = open(folder / "server.log", "w")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_healthy(port, proc, folder / "server.log")
        yield f"http://127.0.0.1:{port}/v1", (drafter, verifier), folder
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and the engine core it started
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _wait_healthy(port: int, proc, log: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"vllm serve exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"vllm serve was not healthy in {timeout_s} s:\n{log.read_text()[-3000:]}")


def test_completions_and_chat_decode_what_specroutes_loop_decodes(server):
    from openai import BadRequestError, OpenAI

    url, (drafter, verifier), folder = server
    client = OpenAI(base_url=url, api_key="none")
    hf_pair = load_pair(str(drafter), str(verifier), dtype="float32")
    prompt = "def fib(n):"
    done = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=24, temperature=0, extra_body={"return_token_ids": True}
    )
    assert done.choices[0].token_ids == _specroute(hf_pair, prompt, RULE, ALPHA)
    messages = [{"role": "user", "content": "2 + 2 ="}]
    chat = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=24, temperature=0, extra_body={"return_token_ids": True}
    )
    text = hf_pair[2].apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat.choices[0].token_ids == _specroute(hf_pair, text, RULE, ALPHA)
    own = client.completions.create(  # a request's own policy, over the server's
        model="tiny",
        prompt=prompt,
        max_tokens=24,
        temperature=0,
        extra_body={"return_token_ids": True, "vllm_xargs": {"specroute_policy": "opt", "specroute_alpha": 0.4}},
    )
    assert own.choices[0].token_ids == _specroute(hf_pair, prompt, "opt", 0.4)
    with pytest.raises(BadRequestError, match="specroute_policy=nope is neither a rule"):
        client.completions.create(
            model="tiny", prompt=prompt, max_tokens=4, extra_body={"vllm_xargs": {"specroute_policy": "nope"}}
        )
    counts = json.loads((folder / "counts.json").read_text())
    assert counts["policy"] == RULE and counts["total"]["drafts"] > 0
    assert any(rid.startswith(("cmpl-", "chatcmpl-")) for rid in counts["requests"])
