"""train: a synthetic separable rule is recovered; export/load; W&B offline; bad input."""

import json
import time

import numpy as np
import pytest
from pathlib import Path
import torch

from specroute import cli
from router.decoding import generate
from router.features import FEATURE_NAMES
from router.model import load_router
from router.records import RecordsError
from router.model import RouterArch
from train.config import TrainConfig
from train.run import run_train
from train.labels import labels

from helpers import synthetic_token_records, write_split, write_synthetic_manifest

ROOT = Path(__file__).resolve().parents[2]


def synthetic_records(folder, n_examples=60, positions=40, seed=0, hidden=0, all_positive=False):
    """Records whose gap is set by feature 0: deferring pays exactly where it exceeds 0.5."""
    g = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    shards = []
    for split, lo, hi in (("train", 0, 40), ("validation", 40, 50), ("test", 50, n_examples)):
        n = (hi - lo) * positions
        feats = g.uniform(0, 1, (n, len(FEATURE_NAMES))).astype(np.float32)
        helps = (feats[:, 0] > 0.5) | all_positive
        q_tok = np.where(helps, 0.2, 0.6).astype(np.float32) + g.uniform(0, 0.05, n).astype(np.float32)
        p_tok = np.where(helps, 0.7, 0.4).astype(np.float32)
        cols = {
            "example_id": [f"ex{lo + i // positions}" for i in range(n)],
            "task": ["syn"] * n,
            "split": [split] * n,
            "mode": ["gold"] * n,
            "position": np.tile(np.arange(positions), hi - lo),
            "token": np.zeros(n, np.int32),
            "draft_token": np.zeros(n, np.int32),
            "q_tail": np.zeros(n),
            "p_tail": np.zeros(n),
            "q_max": np.full(n, 0.6),
            "p_max": np.full(n, 0.7),
            "q_entropy": np.ones(n),
            "p_entropy": np.ones(n),
            "tv": np.full(n, 0.3),
            "kl": np.ones(n),
            "q_token": q_tok,
            "p_token": p_tok,
            "q_argmax": np.zeros(n, np.int32),
            "p_argmax": np.zeros(n, np.int32),
            "q_topk_ids": np.tile([[0, 1]], (n, 1)).astype(np.int32),
            "q_topk_logprobs": np.full((n, 2), np.log(0.5)),
            "p_topk_ids": np.zeros((n, 2), np.int32),
            "p_topk_logprobs": np.zeros((n, 2)),
            "p_at_q_topk_logprobs": np.full((n, 2), np.log(0.5)),
            "features": feats,
        }
        if hidden:
            cols["verifier_hidden"] = g.normal(size=(n, hidden)).astype(np.float16)
        shards.append(write_split(folder, split, cols))
    write_synthetic_manifest(folder, shards, hidden_states="verifier" if hidden else "none")
    return folder


def test_labels_match_paper_definitions():
    cols = {"q_token": [0.2, 0.5], "p_token": [0.6, 0.5], "token": [3, 4], "q_argmax": [3, 1], "p_argmax": [2, 4]}
    assert np.allclose(labels(cols, "expected_01_gap"), [0.4, 0.0])
    assert np.allclose(labels(cols, "logloss_gap"), [np.log(3), 0.0])
    assert np.allclose(labels(cols, "greedy_01_gap"), [-1.0, 1.0])
    with pytest.raises(KeyError, match="unknown target"):
        labels(cols, "bleu")


@pytest.mark.parametrize("arch", ["linear", "mlp", "gru"])
def test_router_recovers_a_separable_rule(tmp_path, arch):
    rec = synthetic_records(tmp_path / "rec")
    cfg = TrainConfig(
        records=[str(rec)],
        max_epochs=8,
        batch_size=128,
        lr=3e-3,
        baselines=arch == "mlp",
        output=str(tmp_path / arch),
        router=RouterArch(arch=arch),
    )
    metrics = run_train(cfg)
    assert metrics["router"]["auc"] > 0.95
    assert metrics["router"]["area"] > 0.9  # near the oracle on this rule
    router = load_router(tmp_path / arch)
    assert router.cfg.metrics["router"]["auc"] == pytest.approx(metrics["router"]["auc"])
    assert (tmp_path / arch / "tradeoff.csv").exists() and (tmp_path / arch / "metrics.json").exists()
    if arch == "mlp":
        assert metrics["baselines"]["gradient_boosting"]["auc"] > 0.95
    q = torch.full((1, 2, 6), 1 / 6)
    p = torch.tensor([0.5, 0.1, 0.1, 0.1, 0.1, 0.1]).expand(1, 2, 6)
    assert torch.allclose(router.target(q, p, 0.0).sum(-1), torch.ones(1, 2))


def test_token_head_learns_the_token_rule_and_drives_generate(tmp_path, tiny):
    rec = synthetic_token_records(tmp_path / "rec")
    cfg = TrainConfig(
        records=[str(rec)],
        target="token_label",
        max_epochs=10,
        batch_size=64,
        lr=3e-3,
        output=str(tmp_path / "tok"),
        router=RouterArch(head="token"),
    )
    metrics = run_train(cfg)
    assert metrics["router"]["auc"] > 0.85  # keep iff the candidate is the verifier's argmax (10% label noise)
    token_v2 = metrics["plugins"]["token_v2"]
    assert metrics["router"]["area"] > token_v2 - 0.03 and token_v2 > metrics["plugins"]["chow"]
    assert metrics["baselines"]["gradient_boosting"]["auc"] > 0.85
    router = load_router(tmp_path / "tok")
    assert router.cfg.head == "token" and router.cfg.token_candidates == 6
    q = torch.tensor([[0.5, 0.3, 0.1, 0.05, 0.03, 0.02]])
    p = torch.tensor([[0.1, 0.7, 0.1, 0.05, 0.03, 0.02]])
    pi = router.target(q, p, 0.0)
    assert torch.allclose(pi.sum(-1), torch.ones(1), atol=1e-6)
    assert pi[0, 1] >= q[0, 1] and pi[0, 0] < q[0, 0]  # keeps the verifier's favourite, defers the other
    drafter, verifier, _ = tiny
    out = generate(
        drafter,
        verifier,
        torch.tensor([[5, 6, 7, 8]]),
        rule=router,
        alpha=0.0,
        gamma=3,
        temperature=1.0,
        max_new_tokens=12,
        seed=0,
    )
    assert out.sequences.shape[1] > 4 and out.stats["blocks"] > 0
    with pytest.raises(ValueError, match="token head"):
        run_train(TrainConfig(records=[str(rec)], output=str(tmp_path / "x"), router=RouterArch(head="token")))


def _wandb_stream(run_dir, wanted, timeout_s: float = 60.0) -> bytes:
    """The offline run's record stream; wandb-core flushes it from its own process shortly after finish()."""
    deadline = time.monotonic() + timeout_s
    while True:
        log = b"".join(f.read_bytes() for f in run_dir.glob("*.wandb"))
        if all(w in log for w in wanted) or time.monotonic() > deadline:
            return log
        time.sleep(0.2)


def test_hidden_state_router_and_wandb_offline(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    rec = synthetic_records(tmp_path / "rec", hidden=8)
    cfg = TrainConfig(
        records=[str(rec)],
        max_epochs=2,
        batch_size=256,
        logger="wandb",
        output=str(tmp_path / "h"),
        router=RouterArch(hidden_inputs=["verifier"]),
    )
    run_train(cfg)
    router = load_router(tmp_path / "h")
    assert router.cfg.hidden_sizes == {"verifier": 8}
    runs = list((tmp_path / "h" / "wandb").glob("offline-run-*"))
    assert runs, "W&B offline run directory missing"
    wanted = (b"hidden_inputs", b"val_area", b"val_auc", b"train_loss", b"tradeoff")
    log = _wandb_stream(runs[0], wanted)
    for logged in wanted:
        assert logged in log, logged  # the config keys, the metrics and the trade-off table
    assert list(runs[0].glob("files/media/table/*.json"))
    assert (tmp_path / "h" / "logs").exists()  # CSV logs are always written


def test_bad_input(tmp_path):
    with pytest.raises(RecordsError, match="no manifest.json|does not exist"):
        run_train(TrainConfig(records=[str(tmp_path / "none")], output=str(tmp_path / "x")))
    rec = synthetic_records(tmp_path / "rec")
    with pytest.raises(RecordsError, match="no verifier hidden states"):
        run_train(
            TrainConfig(records=[str(rec)], output=str(tmp_path / "x"), router=RouterArch(hidden_inputs=["verifier"]))
        )
    manifest = json.loads((rec / "manifest.json").read_text())
    (rec / "manifest.json").write_text(json.dumps({**manifest, "feature_names": ["q_max"]}))
    with pytest.raises(RecordsError, match="recorded with features"):
        run_train(TrainConfig(records=[str(rec)], output=str(tmp_path / "x")))


def test_degenerate_labels_warn_and_still_export(tmp_path):
    rec = synthetic_records(tmp_path / "rec", all_positive=True)
    with pytest.warns(UserWarning, match="one side of 0"):
        run_train(TrainConfig(records=[str(rec)], max_epochs=1, baselines=True, output=str(tmp_path / "d")))
    assert load_router(tmp_path / "d").cfg.arch == "mlp"


def test_cli_train(tmp_path, capsys):
    rec = synthetic_records(tmp_path / "rec")
    assert cli.main(["train", f"records=[{rec}]", "max_epochs=1", f"output={tmp_path / 'c'}"]) == 0
    assert "best plug-in area" in capsys.readouterr().out


def test_datamodule_batches(tmp_path):
    from train.data import RecordDataModule

    rec = synthetic_token_records(tmp_path / "rec")
    dm = RecordDataModule([str(rec)], "gold", "token_label", [], batch_size=100, seed=0, head="token")
    dm.setup("fit")
    x, y, w, idx = next(iter(dm.train_dataloader()))
    assert x.shape == (100, 6, len(FEATURE_NAMES) + 5) and y.shape == w.shape == (100, 6)
    assert torch.allclose(w.sum(-1).double(), torch.ones(100, dtype=torch.float64), atol=1e-5)  # q over candidates
    assert len(dm.val) == 300 and sorted(torch.cat([b[3] for b in dm.val_dataloader()]).tolist()) == list(range(300))
    order = [next(iter(dm.train_dataloader()))[3][:5].tolist() for _ in range(2)]
    assert order[0] != order[1]  # reshuffled every epoch
    cascade = RecordDataModule([str(rec)], "gold", "expected_01_gap", [], batch_size=50, seed=0)
    cascade.setup()
    x, y, w, _ = next(iter(cascade.val_dataloader()))
    assert x.shape == (50, len(FEATURE_NAMES)) and torch.all(w == 1)


@pytest.mark.parametrize(
    "path",
    sorted(
        str(p.relative_to(ROOT))
        for p in [*ROOT.glob("configs/train/*.yaml"), *ROOT.glob("configs/studies/train/*.yaml")]
    ),
)
def test_shipped_train_configs_load(path):
    from router.infra.config import load_config

    cfg = load_config(TrainConfig, ROOT / path, [])
    assert (cfg.router.head == "token") == (cfg.target == "token_label")


def test_architecture_keys_are_flat_dotted_or_a_mapping(tmp_path):
    """The shipped YAMLs write the architecture flat; dotted overrides and a `router:` mapping reach the same
    RouterArch, later keys over earlier ones; unknown and ill-typed keys are refused by their full name."""
    from router.infra.config import ConfigError, load_config

    flat = load_config(TrainConfig, "configs/studies/train/judge-window.yaml", [])
    assert flat.router.head == "judge" and flat.router.follow == 6
    dotted = load_config(TrainConfig, "configs/studies/train/judge-window.yaml", ["router.width=16", "lag=2"])
    assert (dotted.router.width, dotted.router.lag, dotted.router.follow) == (16, 2, 6)
    yaml = tmp_path / "nested.yaml"
    yaml.write_text("records: [r]\nrouter: {head: judge, hidden_inputs: [after]}\nwidth: 8\n")
    nested = load_config(TrainConfig, yaml, ["router.depth=3"])
    assert nested.router == RouterArch(head="judge", hidden_inputs=["after"], width=8, depth=3)
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['router.widht'\].*router.width"):
        load_config(TrainConfig, yaml, ["router.widht=3"])
    with pytest.raises(ConfigError, match=r"\(router\).*width must be int"):
        load_config(TrainConfig, yaml, ["width=wide"])
    with pytest.raises(ConfigError, match="follow .* needs head: judge"):
        load_config(TrainConfig, None, ["follow=2"])
    assert TrainConfig(records=["r"]).router == RouterArch()
