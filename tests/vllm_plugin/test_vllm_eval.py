"""`specroute eval engine=vllm` (router/vllm/grid.py, router/vllm/served.py): the online grid decoded in vLLM with the
plugin, on records and a router made with specroute's own commands on the tiny pair saved as Hugging Face
folders. The references decode what the torch engine decodes; each cascade point decodes what specroute's loop
decodes from vLLM's first (prefill) token with the same policy, alpha and gamma; what vLLM cannot decode is
refused in one line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eval.online import prepare_prompts
from eval.prompts import online_examples
from router.decoding import generate
from router.loop.tiny import save_tiny_pair
from router.infra.config import load_config
from router.model import load_router
from router.pair import load_pair

pytest.importorskip("vllm", reason="the vLLM tests run in .venv-vllm (bash scripts/setup.sh vllm)")

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "specroute.cli"]
GAMMA, TOKENS = 4, 16
GRID = ["offline=false", "max_prompts=4", "batch_size=2", f"max_new_tokens={TOKENS}", f"gamma={GAMMA}"]


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=900, cwd=ROOT)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The tiny pair's folders, records of it and an mlp router trained on them."""
    root = tmp_path_factory.mktemp("served")
    drafter, verifier = save_tiny_pair(root / "pair", hidden=128)
    models = [f"drafter={drafter}", f"verifier={verifier}"]
    for argv in (
        ["gen", "--config", "configs/gen/tiny.yaml", *models, f"output={root / 'records'}"],
        ["train", "--config", "configs/train/tiny.yaml", f"records=[{root / 'records'}]", f"output={root / 'mlp'}"],
    ):
        done = _run(*argv)
        assert done.returncode == 0, done.stderr[-2000:]
    return root, (drafter, verifier)


def _eval_args(root: Path, out: str, *extra: str) -> list[str]:
    records, router = root / "records", root / "mlp"
    config = ["--config", "configs/eval/tiny.yaml", f"records=[{records}]", f"routers=[{router}]"]
    return ["eval", *config, *GRID, f"output={root / out}", *extra]


def _point(root: Path, out: str, name: str) -> dict:
    return json.loads((root / out / "online" / f"{name}.json").read_text())


def _first_then_specroute(pair, prompt: list[int], policy, alpha: float) -> list[int]:
    """specroute's loop as vLLM runs a request: the verifier's first token from the prefill, then blocks of
    GAMMA drafts (a block further, then cut: vLLM drafts whole blocks up to its length limit)."""
    drafter, verifier, _ = pair
    ids = torch.tensor([prompt])
    with torch.no_grad():
        first = int(verifier(ids).logits[0, -1].argmax())
    ids = torch.cat([ids, torch.tensor([[first]])], 1)
    out = generate(
        drafter,
        verifier,
        ids,
        rule=policy,
        alpha=alpha,
        gamma=GAMMA,
        max_new_tokens=TOKENS + GAMMA + 1,
        check_pair=False,
    )
    return [first, *out.sequences[0, ids.shape[1] :].tolist()][:TOKENS]


def test_eval_on_vllm_decodes_the_grid_as_specroutes_loop_does(work):
    root, folders = work
    methods = "online_methods=[lossless, opt, mlp]"
    done = _run(*_eval_args(root, "vllm", methods, "engine=vllm"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert _run(*_eval_args(root, "torch", "online_methods=[lossless]")).returncode == 0
    report = (root / "vllm" / "report.md").read_text()
    assert "vLLM 0.32" in report and f"{GAMMA} drafts per step" in report
    metrics = json.loads((root / "vllm" / "metrics.json").read_text())
    names = [p["method"] for p in metrics["online"]["points"]]
    assert {"verifier", "drafter", "lossless", "opt", "mlp"} <= set(names)
    for name in ("verifier@0", "drafter@0", "lossless@0"):  # the references: what the torch engine decodes
        served, torch_run = _point(root, "vllm", name), _point(root, "torch", name)
        assert [e["new_ids"] for e in served["examples"]] == [e["new_ids"] for e in torch_run["examples"]], name
    # each cascade point: specroute's loop from vLLM's first token, on the same prompts
    cfg = load_config_for(root)
    pair = load_pair(str(folders[0]), str(folders[1]), dtype="float32")
    prompts = prepare_prompts(pair.tokenizer, online_examples(cfg, {}), False, cfg.max_prompts, 256)
    router = load_router(root / "mlp")
    lossless = [e["new_ids"] for e in _point(root, "vllm", "lossless@0")["examples"]]
    differs = 0
    for point in metrics["online"]["points"]:
        if point["method"] not in ("opt", "mlp"):
            continue
        policy = router if point["method"] == "mlp" else "opt"
        name = f"{point['method']}@{point['alpha']:g}"
        got = {e["example_id"]: e["new_ids"] for e in _point(root, "vllm", name)["examples"]}
        for p in prompts:
            assert got[p.example_id] == _first_then_specroute(pair, p.ids, policy, point["alpha"]), (name, p.example_id)
        assert 0 <= point["rejection_rate"] <= 1 and point["verifier_calls_per_token"] > 0
        differs += [got[p.example_id] for p in prompts] != lossless
    assert differs  # some cascade point kept drafts the verifier would not have written


def load_config_for(root: Path):
    from eval.config import EvalConfig

    return load_config(EvalConfig, "configs/eval/tiny.yaml", [f"records=[{root / 'records'}]", "routers=[]", *GRID])


@pytest.mark.parametrize(
    "setting, message",
    [
        ("online_methods=[token_cascade]", "engine vllm cannot decode online method token_cascade"),
        ("gamma=auto", "engine vllm drafts a fixed num_speculative_tokens per step: set gamma to a number"),
        ("gammas={opt: 8}", "engine vllm decodes every speculative method with one block size"),
        ("bonus_from=target", "engine vllm's bonus token is the verifier's: set bonus_from=verifier"),
    ],
)
def test_eval_on_vllm_refuses_what_vllms_loop_cannot_do_in_one_line(work, setting, message):
    root, _ = work
    argv = _eval_args(root, "refused", "online_methods=[opt]", "engine=vllm", setting)
    done = _run(*argv)
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not (root / "refused" / "online").exists()


def test_the_demo_prices_an_evaluation_with_vllms_measured_steps(work):
    """What specroute demo's pricing measures where vLLM is a candidate: a step of each engine at the demo's batch
    size, and the engines' load time; the engines are closed after."""
    from router.vllm.served import ServedPair, measure_served_costs

    root, (drafter, verifier) = work
    served = ServedPair(drafter, verifier, "float32", gamma=GAMMA, max_model_len=512)
    costs = measure_served_costs(served, list(range(10, 40)), batch=2, tokens=8)
    assert set(costs) == {"verifier", "drafter", "speculative", "load_seconds"}
    assert all(v > 0 for v in costs.values()) and served.engines == {}
