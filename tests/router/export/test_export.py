"""Router exports: every folder carries golden vectors, a model card and custom_generate/; every
shipped load path (load_router, from_pretrained, the Hub round trip, ONNX through onnxruntime)
reproduces the golden vectors; and the golden decisions are the decoding loop's own."""

from __future__ import annotations

import pytest
import torch

from router.view import BlockView
from router.export.decision import Decision, input_names
from router.export.golden import read_golden, reproduce, torch_runner
from router.model import LearnedRouter, RouterConfig, RouterNet, load_router, save_router
from router.targets import cascade_mix, token_mix

CONFIGS = {
    "cascade": dict(),
    "token": dict(head="token"),
    "judge": dict(
        head="judge", vocab=259, hidden_inputs=["after", "verifier"], hidden_sizes={"after": 8, "verifier": 8}
    ),
    "judge-window-lag": dict(
        head="judge", vocab=259, follow=3, lag=2, hidden_inputs=["after"], hidden_sizes={"after": 8}
    ),
    "judge-running": dict(head="judge", vocab=259, running=True, hidden_inputs=["after"], hidden_sizes={"after": 8}),
    "judge-lag-running": dict(head="judge", vocab=259, lag=2, running=True),
}


def _trained_looking(cfg: RouterConfig, seed: int = 0) -> LearnedRouter:
    """A router with random weights and a filled token-class table (a judge reads it)."""
    torch.manual_seed(seed)
    net = RouterNet(cfg)
    if cfg.head == "judge":
        net.token_classes.copy_(torch.randint(0, 64, (cfg.vocab,), dtype=torch.uint8))
    return LearnedRouter(net, name=cfg.head)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exports")
    return {h: save_router(_trained_looking(RouterConfig(**c)), tmp / h) for h, c in CONFIGS.items()}


@pytest.mark.parametrize("head", list(CONFIGS))
def test_every_export_holds_its_contract_files(folders, head):
    names = {p.name for p in folders[head].iterdir()}
    assert {"config.json", "model.safetensors", "golden.safetensors", "README.md", "custom_generate"} <= names
    assert (folders[head] / "custom_generate" / "generate.py").exists()
    card = (folders[head] / "README.md").read_text()
    assert "- custom_generate" in card and f"({head.split('-')[0]} head" in card and "custom_generate=" in card


def test_a_gru_export_has_no_golden_vectors(tmp_path):
    folder = save_router(_trained_looking(RouterConfig(arch="gru")), tmp_path / "gru")
    assert not (folder / "golden.safetensors").exists()
    with pytest.raises(ValueError, match="offline-only"):
        Decision(load_router(folder))


@pytest.mark.parametrize("head", list(CONFIGS))
def test_load_paths_reproduce_the_golden_vectors(folders, tmp_path, head):
    routers = [load_router(folders[head]), LearnedRouter.from_pretrained(str(folders[head]))]
    load_router(folders[head]).save_pretrained(tmp_path / "again")
    routers.append(LearnedRouter.from_pretrained(str(tmp_path / "again")))
    for router in routers:
        check = reproduce(folders[head], router.cfg, torch_runner(router))
        assert check["ok"] and check["max_score_error"] == 0.0, check


def test_golden_vectors_catch_a_changed_router(folders):
    router = load_router(folders["cascade"])
    with torch.no_grad():
        router.net.body[-1].bias.add_(0.5)  # another router: its scores move
    check = reproduce(folders["cascade"], router.cfg, torch_runner(router))
    assert not check["ok"] and check["max_score_error"] > 0.4


def _window_and_lag(cfg, inputs: dict) -> dict:
    """The golden inputs of a window / lag judge as target() takes them."""
    from router.window.follow import FollowWindow
    from router.window.lag import LagHistory

    out = {}
    if cfg.follow:
        values = inputs["follow_values"]
        out["follow"] = FollowWindow(
            values.new_zeros(len(values), values.shape[-1]), values, inputs["follow_valid"] > 0
        )
    if cfg.lag or cfg.running:
        n = len(inputs["q_logits"])
        values = inputs["lag_values"] if cfg.lag else torch.zeros(n, 0, 14)
        valid = inputs["lag_valid"] > 0 if cfg.lag else torch.zeros(n, 0, dtype=torch.bool)
        sums = inputs.get("running_sums") if cfg.running else None
        out["lag"] = LagHistory(values, valid, sums, inputs.get("running_count") if cfg.running else None)
    return out


@pytest.mark.parametrize("head", list(CONFIGS))
def test_golden_decisions_are_the_decoding_loops(folders, head):
    """pi formed from the golden decisions equals the router's own decide() (temperature 1)."""
    router = load_router(folders[head])
    inputs, alphas, outputs = read_golden(folders[head])
    q, p = inputs["q_logits"].softmax(-1), inputs["p_logits"].softmax(-1)
    hidden = {f"hidden_{r}": inputs[f"hidden_{r}"] for r in router.cfg.hidden_inputs}
    for i, alpha in enumerate(alphas.tolist()):
        extra = {}
        if router.cfg.head == "judge":
            nxt = inputs["next_p_logits"].softmax(-1)
            extra = dict(drafts=inputs["drafts"], next_p_raw=nxt, **_window_and_lag(router.cfg, inputs))
            keep = outputs["keep"][i]
            want = torch.where(keep[:, None], torch.nn.functional.one_hot(inputs["drafts"], q.shape[-1]).float(), p)
        elif head == "cascade":
            want = cascade_mix(q, p, outputs["defer"][i])
        else:
            keep = torch.zeros_like(q, dtype=torch.bool).scatter(-1, outputs["candidates"], outputs["keep"][i])
            want = token_mix(q, p, keep)
        got = router.decide(BlockView(q, p, q, p, **hidden, **extra), alpha)
        assert torch.allclose(got, want, atol=1e-6)
    assert 0 < int(outputs["keep" if head != "cascade" else "defer"].sum()) < outputs["score"].numel() * len(alphas)


@pytest.mark.parametrize("head", list(CONFIGS))
def test_onnx_export_reproduces_the_golden_vectors(folders, head):
    pytest.importorskip("onnxruntime")
    from router.export.onnx import export_onnx, onnx_runner

    report = export_onnx(folders[head])
    assert report["ok"] and report["decisions_equal"] and report["max_score_error"] < 1e-5, report
    # any vocabulary and number of positions: the graph is not fixed to the golden shapes
    router = load_router(folders[head])
    run = onnx_runner(report["onnx"], input_names(router.cfg))
    wide = {k: (torch.cat([v, v], 0) if v.dim() else v) for k, v in read_golden(folders[head])[0].items()}
    if router.cfg.head != "judge":
        wide = {k: (torch.cat([v, v - 2.0], -1) if k.endswith("logits") else v) for k, v in wide.items()}
    got = run(torch.tensor(0.1), wide)
    want = torch_runner(router)(torch.tensor(0.1), wide)
    assert all(torch.allclose(torch.as_tensor(g).float(), w.float(), atol=1e-5) for g, w in zip(got, want))


def test_export_onnx_command(folders, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    from specroute.cli import main

    assert main(["export-onnx", str(folders["cascade"]), "--output", str(tmp_path / "c.onnx")]) == 0
    out = capsys.readouterr().out
    assert "decisions equal: True" in out and (tmp_path / "c.onnx.json").exists()
    gru = save_router(_trained_looking(RouterConfig(arch="gru")), tmp_path / "gru")
    assert main(["export-onnx", str(gru)]) == 2
    assert "offline-only" in capsys.readouterr().err


def test_push_to_hub_uploads_the_whole_folder(folders, monkeypatch):
    """No network here: the Hub API is stood in for, and what would be uploaded is checked."""
    import huggingface_hub

    uploaded = {}

    class FakeApi:
        def __init__(self, token=None):
            pass

        def create_repo(self, repo_id, private=None, exist_ok=True):
            return type("Repo", (), {"repo_id": repo_id})()

        def upload_folder(self, repo_id, folder_path, **kwargs):
            from pathlib import Path

            uploaded.update(
                repo=repo_id, files=sorted(str(p.relative_to(folder_path)) for p in Path(folder_path).rglob("*"))
            )
            return "commit-url"

    monkeypatch.setattr(huggingface_hub.hub_mixin, "HfApi", FakeApi)
    assert load_router(folders["judge"]).push_to_hub("someone/judge-router") == "commit-url"
    assert uploaded["repo"] == "someone/judge-router"
    assert {
        "config.json",
        "model.safetensors",
        "golden.safetensors",
        "README.md",
        "custom_generate/generate.py",
    } <= set(uploaded["files"])


def test_from_pretrained_resolves_a_hub_id_through_the_cache(folders, monkeypatch):
    import huggingface_hub

    asked = {}

    def snapshot(repo_id, **kwargs):
        asked.update(repo_id=repo_id, **kwargs)
        return str(folders["token"])

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    monkeypatch.setattr(
        huggingface_hub.hub_mixin, "hf_hub_download", lambda **kw: str(folders["token"] / "config.json")
    )
    router = LearnedRouter.from_pretrained("someone/token-router", local_files_only=True)
    assert asked["repo_id"] == "someone/token-router" and asked["local_files_only"] is True
    assert reproduce(folders["token"], router.cfg, torch_runner(router))["ok"]
