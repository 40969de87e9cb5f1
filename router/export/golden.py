"""Golden vectors: a few positions of decision inputs -> expected scores and decisions, per export.

Every export writes `golden.safetensors`: seeded logits (and drafts, lookahead logits and hidden
states where the head reads them), the alphas, and what `router.export.decision.Decision` -- the
decoding loop's own code -- gives there. A port to another engine (or the ONNX export) reproduces
them: `reproduce(folder, run)` runs any implementation on the stored inputs and compares.
Tensor names: `input.<name>` in `decision.input_names` order, `alphas` (A,), `output.<name>` with a
leading alpha axis (A, ...) for the decisions (score-like outputs do not depend on alpha: (...)).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from router.inputs import judge_inputs
from router.infra.files import file_sha256
from router.export.decision import Decision, input_names, output_names

GOLDEN_FILE = "golden.safetensors"
POSITIONS, VOCAB = 8, 512
DECISIONS = ("defer", "keep")  # outputs that depend on alpha
SCORE_TOLERANCE = 1e-4  # on |a - b| / max(1, |b|): float32 features over V entries, another engine's kernels


def golden_inputs(cfg, seed: int = 0, net=None) -> dict[str, torch.Tensor]:
    """Seeded inputs: logits of varied sharpness that agree at some positions and not at others; hidden
    states drawn around the router's own input standardisation (its training data's mean and std) when
    the network is given, so the scores stay in the range the router was fitted on."""
    g = torch.Generator().manual_seed(seed)
    vocab = min(cfg.vocab, VOCAB) if cfg.head == "judge" else VOCAB
    sharp = torch.linspace(0.5, 4.0, POSITIONS)[:, None]  # (N, 1)
    base = torch.randn(POSITIONS, vocab, generator=g)
    p_logits = sharp * (base + 0.3 * torch.randn(POSITIONS, vocab, generator=g))
    q_logits = sharp * (base + torch.randn(POSITIONS, vocab, generator=g))
    out = {"q_logits": q_logits, "p_logits": p_logits}
    if cfg.head == "judge":
        sampled = torch.multinomial(q_logits.softmax(-1), 1, generator=g).squeeze(-1)
        half = torch.arange(POSITIONS) < POSITIONS // 2
        out["drafts"] = torch.where(half, q_logits.argmax(-1), sampled)  # greedy drafts, then sampled ones
        out["next_p_logits"] = 3 * torch.randn(POSITIONS, vocab, generator=g)
    for spec in judge_inputs(cfg):  # each extra input's seeded values, in its order (router/inputs.py)
        out.update(spec.golden(cfg, g, POSITIONS, VOCAB))
    start = cfg.position_dim - sum(cfg.hidden_sizes[r] for r in cfg.hidden_inputs)  # hidden states come last
    for role in cfg.hidden_inputs:
        width = cfg.hidden_sizes[role]
        noise = torch.randn(POSITIONS, width, generator=g)
        if net is not None:
            noise = net.mean[start : start + width] + net.std[start : start + width] * noise
        out[f"hidden_{role}"] = noise
        start += width
    return out


def _alphas(cfg, outputs: tuple) -> torch.Tensor:
    """Three alphas between consecutive values of the decision statistic, so decisions are mixed and
    no position sits on a threshold (another engine's rounding cannot flip them)."""
    score = outputs[output_names(cfg).index("score")].flatten()
    stat = score / outputs[1].clamp_min(1e-6) if cfg.head == "cascade" else score
    s = stat.sort().values
    picks = [len(s) // 4, len(s) // 2, 3 * len(s) // 4]
    return torch.tensor([float((s[i - 1] + s[i]) / 2) for i in picks])


def compute(router, inputs: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(alphas (A,), outputs) of the loop's decision code on golden inputs."""
    run = torch_runner(router)
    probe = run(torch.tensor(0.0), inputs)
    alphas = _alphas(router.cfg, probe)
    per_alpha = [run(a, inputs) for a in alphas]
    outputs = {}
    for i, name in enumerate(output_names(router.cfg)):
        outputs[name] = torch.stack([o[i] for o in per_alpha]) if name in DECISIONS else probe[i]
    return alphas, outputs


def write_golden(router, folder: str | Path) -> Path:
    """golden.safetensors in the router folder (gru routers, offline-only, get none)."""
    inputs = golden_inputs(router.cfg, net=router.net)
    alphas, outputs = compute(router, inputs)
    tensors = {f"input.{k}": v.contiguous() for k, v in inputs.items()}
    tensors.update({f"output.{k}": v.contiguous() for k, v in outputs.items()}, alphas=alphas)
    path = Path(folder) / GOLDEN_FILE
    save_file(tensors, str(path), metadata={"weights_sha256": _weights_sha(folder)})  # which weights they pin
    return path


def _weights_sha(folder: str | Path) -> str:
    weights = Path(folder) / "model.safetensors"
    return file_sha256(weights) if weights.exists() else ""


class StaleGolden(ValueError):
    """The golden vectors were written for other weights than the folder holds now."""


def check_golden_current(folder: str | Path, router=None) -> None:
    """Refuse golden vectors written for other weights: by the sha they record, or (files written before
    they recorded one) by the loop's own code failing to reproduce them. The fix is named."""
    path = Path(folder) / GOLDEN_FILE
    with safe_open(str(path), "pt") as f:
        recorded = (f.metadata() or {}).get("weights_sha256")
    now = _weights_sha(folder)
    if recorded is not None and recorded != now:
        why = f"they pin weights {recorded[:12]}, the folder holds {now[:12]}"
    elif recorded is None and router is not None and not reproduce(folder, router.cfg, torch_runner(router))["ok"]:
        why = "the router's own torch code no longer reproduces them"
    else:
        return
    raise StaleGolden(
        f"{path} is stale ({why}): the weights changed after the vectors were written. Write them again from "
        f"the current weights with `specroute export-onnx {folder} --refresh-golden`"
    )


def read_golden(folder: str | Path) -> tuple[dict, torch.Tensor, dict]:
    """(inputs, alphas, expected outputs) of a router folder's golden vectors."""
    path = Path(folder) / GOLDEN_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: re-export the router (save_router writes it)")
    t = load_file(str(path))
    inputs = {k.split(".", 1)[1]: v for k, v in t.items() if k.startswith("input.")}
    outputs = {k.split(".", 1)[1]: v for k, v in t.items() if k.startswith("output.")}
    return inputs, t["alphas"], outputs


def reproduce(folder: str | Path, cfg, run) -> dict:
    """Run `run(alpha, inputs) -> outputs in output_names order` at every golden alpha and compare:
    {max_score_error, decisions_equal, checked}: scores within SCORE_TOLERANCE (|a - b| / max(1, |b|)) and
    equal decisions and candidates pass."""
    inputs, alphas, expected = read_golden(folder)
    names = output_names(cfg)
    worst, equal, checked = 0.0, True, 0
    for i, alpha in enumerate(alphas):
        got = dict(zip(names, run(alpha, inputs)))
        for name in names:
            want = expected[name][i] if name in DECISIONS else expected[name]
            value = torch.as_tensor(got[name])
            if name in DECISIONS or name == "candidates":
                equal = equal and bool(torch.equal(value.to(want.dtype), want))
            else:
                error = (value.float() - want.float()).abs() / want.float().abs().clamp_min(1.0)
                worst = max(worst, float(error.max()))
            checked += want.numel()
    return {
        "max_score_error": worst,
        "decisions_equal": equal,
        "checked": checked,
        "ok": equal and worst <= SCORE_TOLERANCE,
    }


def torch_runner(router):
    """`reproduce`'s run function for a loaded router (the decoding loop's own code)."""
    decide = Decision(router).eval()
    order = [n for n in input_names(router.cfg) if n != "alpha"]

    def run(alpha, inputs):
        with torch.no_grad():
            args = [inputs[n] for n in order]
            return decide(*args[:2], alpha, *args[2:])

    return run
