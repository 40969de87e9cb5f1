"""Helpers the tests share: tiny random Qwen2 models built from configs (no downloads), stub
language models with chosen next-token distributions, hand-built record folders from full
distributions over a small vocabulary, and online points built by hand.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import torch

from router.loop.layout import left_pad
from router.loop.tiny import tiny_model
from router.features import FEATURE_NAMES, token_features
from router.policy import Needs
from router.records import Manifest, rows_to_table, write_manifest, write_shard

VOCAB = 96
EOS = 2


def tiny_qwen(seed: int, layers: int = 2, hidden: int = 64, vocab: int = VOCAB):
    """A random Qwen2 causal LM (float32, eval mode, EOS id 2) over a small vocabulary."""
    return tiny_model(seed, layers, hidden, vocab)


def left_padded(prompts: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return left_pad(prompts, pad)


class _StubCache:
    """Stands in for a KV cache: only tracks its length (the stub's logits need no memory)."""

    def __init__(self):
        self.length = 0

    def crop(self, n: int) -> None:
        assert n < 0, "crop takes a negative count"
        self.length += n

    def batch_select_indices(self, rows) -> None:
        pass


class StubLM(torch.nn.Module):
    """A causal LM whose next-token logits depend only on the position being predicted.

    `choose(pos) -> token` gives the argmax at position pos (0-based, counting prompt tokens);
    `probs(pos) -> (V,)` may give a full distribution instead. Forward calls are counted.
    """

    def __init__(self, choose=None, probs=None, vocab: int = 16, eos: int = 2):
        super().__init__()
        self.choose, self.probs, self.vocab = choose, probs, vocab
        self.head = torch.nn.Linear(1, vocab, bias=False)
        self.config = type("Cfg", (), {"eos_token_id": eos})()
        self.generation_config = type("Gen", (), {"eos_token_id": eos, "pad_token_id": 0})()
        self.calls = 0

    def get_output_embeddings(self):
        return self.head

    def forward(self, input_ids, attention_mask, position_ids, cache=None, use_cache=True, logits_to_keep=1):
        self.calls += 1
        cache = cache or _StubCache()
        cache.length += input_ids.shape[1]
        assert cache.length == attention_mask.shape[1], "the cache and the mask disagree on length"
        nxt = position_ids[:, -logits_to_keep:] + 1  # (B, keep) positions being predicted
        if self.probs is not None:
            logits = torch.stack([torch.stack([self.probs(int(t)) for t in row]) for row in nxt]).log()
        else:
            logits = torch.full((*nxt.shape, self.vocab), -20.0)
            for b, row in enumerate(nxt):
                for k, t in enumerate(row):
                    logits[b, k, self.choose(int(t))] = 20.0
        return type("Out", (), {"logits": logits, "cache": cache})()


def synthetic_token_records(
    folder,
    n_examples=60,
    positions=30,
    vocab=6,
    seed=0,
    manifest_extra=None,
    keep=None,
    consequence=False,
    answer_labels="full",
):
    """Records over a vocab of 6 where the gold token is the verifier's argmax 90% of the time:
    keeping exactly the verifier's favourite candidate (what token_v2 does at alpha 0) is right.
    consequence=True: consequence-mode rows whose label at a mismatch (argmax q != argmax p) is
    IMPORTANT where the verifier's argmax is the gold token and the drafter's is not, else HARMLESS
    (one mismatch in ten UNTESTED). answer_labels: "full" (those labels), "full+horizon" (and a short-horizon
    score at every mismatch: how much less likely the verifier finds the drafter's argmax than its own,
    log p(p_argmax) - log p(q_argmax), NaN at agreements), "horizon" (the scores, every mismatch
    UNTESTED: short-horizon labels only) or "untested" (no label at all)."""
    g = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    shards = []
    for split, lo, hi in (("train", 0, 40), ("validation", 40, 50), ("test", 50, n_examples)):
        n = (hi - lo) * positions
        q = (torch.randn(n, vocab, generator=g) * 1.5).softmax(-1).double()
        p = (torch.randn(n, vocab, generator=g) * 1.5).softmax(-1).double()
        y = torch.where(torch.rand(n, generator=g) < 0.9, p.argmax(-1), torch.randint(0, vocab, (n,), generator=g))
        ids = q.argsort(-1, descending=True)  # every token is a candidate (k = vocab)
        if keep is not None:
            keep[split] = (q, p, y)  # the full distributions, for exact expectations in tests
        rows = torch.arange(n)
        cols = {
            "example_id": [f"ex{lo + i // positions}" for i in range(n)],
            "task": ["syn"] * n,
            "split": [split] * n,
            "mode": ["gold"] * n,
            "position": np.tile(np.arange(positions), hi - lo),
            "token": y.numpy().astype(np.int32),
            "draft_token": ids[:, 0].numpy().astype(np.int32),
            "q_tail": np.zeros(n),
            "p_tail": np.zeros(n),
            "q_max": q.amax(-1).numpy(),
            "p_max": p.amax(-1).numpy(),
            "q_entropy": np.ones(n),
            "p_entropy": np.ones(n),
            "tv": (p - q).clamp_min(0).sum(-1).numpy(),
            "kl": np.ones(n),
            "q_token": q[rows, y].numpy(),
            "p_token": p[rows, y].numpy(),
            "q_argmax": q.argmax(-1).numpy().astype(np.int32),
            "p_argmax": p.argmax(-1).numpy().astype(np.int32),
            "q_topk_ids": ids.numpy().astype(np.int32),
            "q_topk_logprobs": q.gather(-1, ids).log().numpy(),
            "p_topk_ids": ids.numpy().astype(np.int32),
            "p_topk_logprobs": p.gather(-1, ids).log().numpy(),
            "p_at_q_topk_logprobs": p.gather(-1, ids).log().numpy(),
            "features": token_features(q.float(), p.float()).numpy(),
        }
        if consequence:
            cols["mode"] = ["consequence"] * n
            cols["consequence"] = _consequence_labels(q.argmax(-1), p.argmax(-1), y, g)
            _answer_labels(cols, p, answer_labels)
        shards.append(write_split(folder, split, cols))
    write_synthetic_manifest(folder, shards, **(manifest_extra or {}))
    return folder


def _answer_labels(cols: dict, p: torch.Tensor, kind: str) -> None:
    from router.labels import AGREE, UNTESTED

    if kind not in ("full", "full+horizon", "horizon", "untested"):
        raise ValueError(f"answer_labels {kind!r}: use full, full+horizon, horizon or untested")
    q_arg, p_arg = torch.as_tensor(cols["q_argmax"]).long(), torch.as_tensor(cols["p_argmax"]).long()
    # the verifier's verdict per example (even examples right, odd wrong): an important mismatch is a harm
    # in the first, a rescue in the second
    cols["answer_correct"] = np.array([1 - int(e[2:]) % 2 for e in cols["example_id"]], dtype=np.int8)
    if kind in ("full+horizon", "horizon"):
        rows = torch.arange(len(q_arg))
        gap = (p[rows, p_arg].log() - p[rows, q_arg].log()).numpy()
        cols["horizon_score"] = np.where(q_arg.numpy() != p_arg.numpy(), gap, np.nan).astype(np.float32)
    if kind in ("horizon", "untested"):
        cols["consequence"] = np.where(cols["consequence"] == AGREE, AGREE, UNTESTED).astype(np.int8)


def _consequence_labels(q_arg, p_arg, y, g) -> np.ndarray:
    from router.labels import AGREE, HARMLESS, IMPORTANT, UNTESTED

    label = torch.where((p_arg == y) & (q_arg != y), IMPORTANT, HARMLESS)
    label = torch.where(torch.rand(len(y), generator=g) < 0.1, UNTESTED, label)
    return torch.where(q_arg == p_arg, AGREE, label).numpy().astype(np.int8)


def write_split(folder, split: str, cols: dict) -> dict:
    """One shard of a split's columns; its manifest entry."""
    name = f"{split}-00000.arrow"
    write_shard(folder, name, rows_to_table(cols))
    return {"file": name, "split": split, "rows": len(cols["example_id"])}


def write_synthetic_manifest(folder, shards: list[dict], **fields) -> None:
    """The manifest of a hand-built record folder of task "syn" (fields override the defaults)."""
    defaults = {"feature_names": list(FEATURE_NAMES), "hidden_states": "none", "task": "syn"}
    write_manifest(folder, Manifest(**{"shards": shards, **defaults, **fields}))


def online_point(method: str, alpha: float, **measured):
    """An OnlinePoint with neutral measurements that agree with its own receipts (one prompt of 3 tokens, one
    batch of 1 s), `measured` overriding any field (e.g. relative_latency=0.6, batches=[...])."""
    from eval.points import OnlinePoint

    times = dict.fromkeys(("drafter_seconds", "verifier_seconds", "bonus_drafter_seconds", "rule_seconds"), 0.0)
    times.update(drafter_seconds=0.25, verifier_seconds=0.25)
    fields = dict(
        prompts=1,
        batch_size=1,
        scores={"quality": 1.0},
        tokens=3,
        seconds=1.0,
        model_seconds=0.5,
        time_parts=times,
        batches=[{"seconds": 1.0, "longest": 3}],
        seconds_per_token=1.0 / 3,
        verifier_calls_per_token=0.4,
        rejection_rate=0.1,
        outside_model_fraction=0.5,
        examples=[{"example_id": "e0", "text": "abc", "tokens": 3, "quality": 1.0}],
    )
    return OnlinePoint(method, alpha, **{**fields, **measured})


def study_module(name: str):
    """studies/<name>.py imported as a module (the studies are scripts, not a package)."""
    return script_module("studies", name)


def script_module(folder: str, name: str):
    """<folder>/<name>.py of the repository (studies/, benchmarks/: scripts, not packages) as a module."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / folder / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{folder}_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def verifier_qa(pair, path, n: int = 40):
    """A jsonl task (id, question, answer) whose gold answers are the tiny verifier's own greedy text:
    random models never write real answers, and a judge needs positions where the drafter's token is
    (and is not) the gold one. Returns the path."""
    import json

    rows, ascii_ids = [], set(range(32 + 3, 127 + 3))  # byte b is id b + 3: printable ASCII round-trips
    suppress = [i for i in range(259) if i not in ascii_ids]
    for i in range(n):
        prompt = f"Add {i} and {i + 3}.\nA:"
        ids = torch.tensor([pair.tokenizer.encode(prompt)])
        out = pair.verifier.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16, suppress_tokens=suppress
        )
        rows.append({"id": f"q{i}", "question": prompt, "answer": pair.tokenizer.decode(out[0, ids.shape[1] :])})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def assert_generate_routes_agree(drafter, verifier, ids, folder, router, gammas=(1, 3), max_new_tokens: int = 10):
    """A router decodes the same tokens through specroute's generate and transformers' generate (its exported
    folder as `rule`), greedily at each gamma."""
    import torch

    from router.decoding import generate
    from router.hf import cascade_generate

    for gamma in gammas:
        out = generate(drafter, verifier, ids, rule=router, alpha=0.0, gamma=gamma, max_new_tokens=max_new_tokens)
        hf = verifier.generate(
            ids, attention_mask=torch.ones_like(ids), custom_generate=cascade_generate, assistant_model=drafter,
            rule=str(folder), alpha=0.0, gamma=gamma, max_new_tokens=max_new_tokens, do_sample=False,
        )  # fmt: skip
        assert torch.equal(hf, out.sequences), gamma


def one_rule_online_eval(rec, *extra: str) -> list[str]:
    """`specroute eval` arguments for a quick online-only run on tiny records: no router, `opt` at half the
    verifier's rejection, batch 1 (add max_prompts, max_new_tokens, output, ...)."""
    return [
        "eval",
        "--config",
        "configs/eval/tiny.yaml",
        f"records=[{rec}]",
        "routers=[]",
        "offline=false",
        "batch_size=1",
        "online_methods=[opt]",
        "online_rejection_targets=[0.5]",
        *extra,
    ]


# --- a tiny answer-level recording: the custom QA task, a verdict the tests control, its GenConfig ---

CONSEQUENCE_BUDGET, CONSEQUENCE_MISMATCHES = 14, 3  # answer tokens and branches per example in tiny recordings


def length_metric(text: str, meta: dict) -> dict:
    """A verdict the test controls: 'correct' when the answer's character codes do not sum to a multiple of 3."""
    total = sum(map(ord, text))
    return {"quality": float(total % 3 != 0), "answer": str(total % 3)}


def qa_data(tmp_path, n: int):
    """n addition questions in a jsonl file (the custom task tiny_gen_config reads)."""
    import json

    rows = [
        {"id": f"q{i}", "question": f"Question {i}: what is {i} plus {i}?\nAnswer:", "answer": f" {2 * i}."}
        for i in range(n)
    ]
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


def custom_gen_config(data, output, **kw):
    """The GenConfig of the custom QA task `data` (question/answer/id fields) on the tiny pair in float32, written
    to `output`, with `kw` over it: the base every tiny recording in the tests starts from."""
    from data_gen.config import GenConfig

    base = dict(
        task="custom",
        data_path=str(data),
        prompt_field="question",
        reference_field="answer",
        id_field="id",
        drafter="tiny:drafter",
        verifier="tiny:verifier",
        dtype="float32",
        output=str(output),
    )
    return GenConfig(**{**base, **kw})


def tiny_gen_config(tmp_path, data, **kw):
    """The GenConfig of a tiny recording of the custom QA task `data` on the tiny pair (gold and consequence
    rows, judge inputs, the length3 verdict), with `kw` over it."""
    base = dict(
        batch_size=3,
        examples_per_shard=4,
        modes=["gold", "consequence"],
        metric="length3",
        consequence_max_new_tokens=CONSEQUENCE_BUDGET,
        consequence_max_mismatches=CONSEQUENCE_MISMATCHES,
        consequence_batch_size=2,
        split_fractions=[0.6, 0.4, 0.0],
        max_continuation_tokens=20,
        judge=True,
    )
    kw = {**base, **kw}
    return custom_gen_config(data, kw.pop("output", tmp_path / "rec"), **kw)


def consequence_recording(tmp_path, pair, n: int = 10, **kw):
    """A tiny consequence recording of n questions made with `pair` (length3 verdicts); returns its config."""
    import pytest

    from data_gen.recorder import Recorder
    from data_gen.run import run_gen
    from router.tasks import metrics

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(metrics.METRICS, "length3", length_metric)
        cfg = tiny_gen_config(tmp_path, qa_data(tmp_path, n), **kw)
        run_gen(cfg, Recorder(cfg, *pair))
    return cfg


# --- policies that record what the decoding loop gives them (lag and running inputs) ---

PROBE_LAG = 2  # positions a LagProbe reads back


class LagProbe:
    """A lossless lag policy that keeps what the loop gives it."""

    name, form, needs = "lag-probe", "judge", Needs({"drafts", "lookahead"}, lag=PROBE_LAG)

    def __init__(self):
        self.seen = []

    def check_alpha(self, alpha):
        return float(alpha)

    def decide(self, view, alpha):
        from router.features import position_stats

        self.seen.append((view.drafts.clone(), view.read("lag"), position_stats(view.q_raw, view.p_raw)[0]))
        return view.p


class RunningProbe(LagProbe):
    """A lossless running policy that keeps what the loop gives it."""

    name, needs = "running-probe", Needs({"drafts", "lookahead"}, running=True)


class ViewStats:
    """A probe that reads the block's position features from the view (BlockView.position_stats), as a learned
    router does: the loop's carry then takes them from there instead of computing them again."""

    def decide(self, view, alpha):
        self.seen.append((view.drafts.clone(), view.read("lag"), view.position_stats()[0]))
        return view.p


def count_block_feature_passes(monkeypatch) -> list:
    """The position-feature passes router/window/lag.py makes over a block (B, g, V) or its lag gather (B, L, V)."""
    import router.window.lag as lag_module

    passes, real = [], lag_module.position_stats

    def counted(q_raw, p_raw, *rest):
        if q_raw.dim() == 3:
            passes.append(tuple(q_raw.shape))
        return real(q_raw, p_raw, *rest)

    monkeypatch.setattr(lag_module, "position_stats", counted)
    return passes


def teacher_forced_features(drafter, verifier, ids: list[int], start: int) -> torch.Tensor:
    """(T, F) the position features of every answer token of ids (answer from `start`), no cache."""
    from router.features import position_stats

    x = torch.tensor([ids])
    q = drafter(x).logits[0, start - 1 : -1].float().softmax(-1)
    p = verifier(x).logits[0, start - 1 : -1].float().softmax(-1)
    vocab = min(q.shape[-1], p.shape[-1])
    return position_stats(q[:, :vocab], p[:, :vocab])[0]


def cli_on_a_full_disk(kilobytes: int, argv: list[str], tmp_path) -> subprocess.CompletedProcess:
    """`specroute ARGV` with tmp_path/full a tmpfs of `kilobytes` (a user and mount namespace: no root needed);
    skips where unshare or the mount is not allowed."""
    import pytest

    if not shutil.which("unshare"):
        pytest.skip("util-linux's unshare is not installed")
    script = f'mount -t tmpfs -o size={kilobytes}k tmpfs {tmp_path / "full"} && exec "$@"'
    (tmp_path / "full").mkdir(exist_ok=True)
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs in a user namespace here: {probe.stderr.strip()}")
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", sys.executable, "-m", "specroute.cli", *argv],
        capture_output=True,
        text=True,
        timeout=300,
    )
