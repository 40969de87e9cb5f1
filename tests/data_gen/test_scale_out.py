"""Scale-out: `specroute gen` and `specroute eval` under torchrun (2 CPU processes, gloo) write
exactly what one process writes; training runs under DDP with each rank on its share."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from router.records import load_records

ROOT = Path(__file__).resolve().parents[2]


def specroute(args: list[str], nproc: int = 1, timeout: int = 600) -> subprocess.CompletedProcess:
    """The specroute command, in one process or under torchrun with nproc CPU processes (gloo).
    One thread per process either way, so both runs compute with the same kernels."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m"]
        if nproc > 1
        else [sys.executable, "-m"]
    )
    done = subprocess.run(
        [*launcher, "specroute.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    return done


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    root = tmp_path_factory.mktemp("scale")
    gen = ["gen", "--config", "configs/gen/tiny.yaml", "max_examples=20", "examples_per_shard=4"]
    specroute([*gen, f"output={root / 'one'}"])
    specroute([*gen, f"output={root / 'two'}"], nproc=2)
    return root


@pytest.mark.e2e
def test_two_process_recording_equals_one_process(records):
    one, two = (load_records(records / name).to_pandas() for name in ("one", "two"))
    assert len(one) > 0 and list(one.columns) == list(two.columns)
    assert one.equals(two)  # every column, every row, in order
    m1, m2 = (json.loads((records / name / "manifest.json").read_text()) for name in ("one", "two"))
    for key in ("splits", "tokens", "models", "shards"):
        assert m1[key] == m2[key], key
    untimed = lambda counts: {k: v for k, v in counts.items() if not k.endswith("_seconds")}  # noqa: E731
    assert untimed(m1["counts"]) == untimed(m2["counts"])  # each shard's own seconds differ run to run
    assert m1["models"]["verifier"]["device_map"] is None and m1["models"]["verifier"]["placement"] == "cpu"
    # resume per rank: a lost shard is recorded again by the rank that owns it
    shard = records / "two" / m2["shards"][1]["file"]
    shard.unlink()
    (records / "two" / "manifest.json").unlink()
    specroute(
        [
            "gen",
            "--config",
            "configs/gen/tiny.yaml",
            "max_examples=20",
            "examples_per_shard=4",
            f"output={records / 'two'}",
        ],
        nproc=2,
    )
    assert load_records(records / "two").to_pandas().equals(one)


def _trained_router(records: Path) -> Path:
    router = records / "router"
    if not (router / "model.safetensors").exists():
        specroute(
            [
                "train",
                "--config",
                "configs/train/tiny.yaml",
                f"records=[{records / 'one'}]",
                f"output={router}",
                "max_epochs=2",
            ]
        )
    return router


@pytest.mark.e2e
def test_two_process_eval_equals_one_process(records):
    router = _trained_router(records)
    args = [
        "eval",
        "--config",
        "configs/eval/tiny.yaml",
        f"records=[{records / 'one'}]",
        f"routers=[{router}]",
        "max_prompts=3",
        "max_new_tokens=6",
        "online_methods=[opt,router,lossless]",
        "bootstrap=50",
    ]
    specroute([*args, f"output={records / 'eval-one'}"])
    specroute([*args, f"output={records / 'eval-two'}"], nproc=2)
    one, two = (json.loads((records / name / "metrics.json").read_text()) for name in ("eval-one", "eval-two"))
    quality = ("area", "best_quality", "best_top1", "quality_at_25pct", "quality_at_50pct", "quality_at_75pct")
    for m, v in one["offline"]["summary"]["methods"].items():  # latencies use each run's measured cost ratio
        w = two["offline"]["summary"]["methods"][m]
        assert all(v[k] == w[k] or (v[k] != v[k] and w[k] != w[k]) for k in quality), m
    p1, p2 = one["online"]["points"], two["online"]["points"]
    assert [(p["method"], p["alpha"]) for p in p1] == [(p["method"], p["alpha"]) for p in p2]
    for a, b in zip(p1, p2):  # the same decoding: outputs, quality, rejections (latencies are the machine's)
        for key in ("quality", "tokens", "rejection_rate", "verifier_calls_per_token"):
            assert a[key] == b[key] or (a[key] != a[key] and b[key] != b[key]), key
    outputs = {}
    for name in ("eval-one", "eval-two"):
        outputs[name] = {
            f.name: [e["new_ids"] for e in json.loads(f.read_text())["examples"]]
            for f in (records / name / "online").glob("*.json")
        }
    assert outputs["eval-one"] == outputs["eval-two"] and len(outputs["eval-one"]) >= 4
    assert (records / "eval-two" / "report.md").exists()


@pytest.mark.e2e
def test_training_under_ddp_on_two_cpu_processes(records):
    out = records / "router-ddp"
    done = specroute(
        [
            "train",
            "--config",
            "configs/train/tiny.yaml",
            f"records=[{records / 'one'}]",
            f"output={out}",
            "max_epochs=2",
            "strategy=ddp",
            "devices=2",
            "accelerator=cpu",
            "batch_size=64",
        ]
    )
    metrics = json.loads((out / "metrics.json").read_text())
    single = json.loads((_trained_router(records) / "metrics.json").read_text())
    assert metrics["train_rows"] == single["train_rows"] and metrics["val_rows"] == single["val_rows"]
    assert (out / "model.safetensors").exists() and "greedy_area" in metrics["router"]
    # Lightning's DDP lines go to the third-party logs each rank names at its end (router/infra/quiet.py)
    logs = [line.rsplit(" are in ", 1)[1] for line in done.stderr.splitlines() if "third-party messages" in line]
    said = done.stdout + done.stderr + "".join(Path(log).read_text() for log in logs)
    assert "distributed_backend=gloo" in said or "GLOBAL_RANK: 1" in said
    assert "distributed_backend=gloo" not in done.stdout + done.stderr  # not on the user's terminal


def test_each_rank_gets_a_disjoint_equal_share_of_the_training_batches(monkeypatch):
    import torch.distributed as dist

    from train.data import rank_share

    batches = list(range(11))
    assert rank_share(batches) == batches  # one process: everything
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 3)
    shares = []
    for rank in range(3):
        monkeypatch.setattr(dist, "get_rank", lambda rank=rank: rank)
        shares.append(rank_share(batches))
    assert [len(s) for s in shares] == [3, 3, 3] and not set(shares[0]) & set(shares[1]) | set(shares[2]) & set(
        shares[0]
    )
    assert sorted(sum(shares, [])) == [0, 1, 2, 3, 4, 5, 6, 7, 8]
