"""`specroute export-onnx DIR`: a router head's decision as an ONNX graph, checked with onnxruntime.

The graph is `router.export.decision.Decision` traced by torch's ONNX exporter (dynamo), so it holds
the features too (softmax, entropies, TV, KL, margins, the candidates' top-K, the judge's lookahead and
token-class table) and takes any number of positions N and any vocabulary V. What it leaves to the
engine: forming pi from the decision and sampling (docs/router-format.md). gru routers have no
stateless decision (they read a trajectory the loop does not carry) and are refused. Needs the
optional extra: pip install 'specroute[onnx]' (onnx, onnxscript, onnxruntime).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from router.export.decision import Decision, input_names, output_names
from router.export.golden import check_golden_current, read_golden, reproduce, write_golden
from router.infra.files import write_json
from router.infra.stage_folders import claim_output_file

ONNX_FILE = "decision.onnx"
ONNX_REPORT = "decision.onnx.json"
EXTRA = "pip install 'specroute[onnx]' (onnx, onnxscript, onnxruntime)"


def _need(module: str):
    try:
        return __import__(module)
    except ImportError:
        raise ImportError(f"ONNX export needs {module}: {EXTRA}") from None


def _dynamic_shapes(cfg) -> tuple:
    """N (positions) and V (vocabulary) free in every input; alpha a scalar. Shaped as Decision.forward's
    arguments: q_logits, p_logits, alpha, then the rest as one tuple (*rest)."""
    shapes = [{0: "n", 1: "v"} if name.endswith("logits") else {0: "n"} for name in input_names(cfg)[3:]]
    logits = {0: "n", 1: "v"}
    return (logits, logits, None, tuple(shapes)) if shapes else (logits, logits, None)


def export_onnx(folder: str | Path, output: str | Path | None = None, refresh_golden: bool = False) -> dict:
    """Write the decision graph (default DIR/decision.onnx), run it with onnxruntime on the folder's
    golden vectors, write the check next to it (decision.onnx.json) and return it. Golden vectors written for
    other weights are refused with the fix (StaleGolden), unless `refresh_golden` writes them again first."""
    from router.model import load_router

    for module in ("onnx", "onnxscript", "onnxruntime"):
        _need(module)
    folder = Path(folder)
    router = load_router(folder)
    if router.offline_only:
        raise ValueError(router.offline_only)
    # never a folder, never over a recording's, an eval's or a user's file (router/infra/stage_folders.py)
    path = claim_output_file(output if output else folder / ONNX_FILE, "export-onnx")
    path.parent.mkdir(parents=True, exist_ok=True)
    if refresh_golden or not (folder / "golden.safetensors").exists():
        write_golden(router, folder)  # asked for, or a folder exported before golden vectors existed
    check_golden_current(folder, router)
    inputs, _, _ = read_golden(folder)
    names = input_names(router.cfg)
    args = tuple(torch.tensor(0.1) if n == "alpha" else inputs[n] for n in names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notes on merged dynamic axes and the like
        torch.onnx.export(
            Decision(router).eval(),
            args,
            str(path),
            dynamo=True,
            input_names=names,
            output_names=list(output_names(router.cfg)),
            dynamic_shapes=_dynamic_shapes(router.cfg),
        )
    check = reproduce(folder, router.cfg, onnx_runner(path, names))
    report = {"onnx": str(path), "inputs": names, "outputs": list(output_names(router.cfg)), **check}
    report["torch"] = torch.__version__
    write_json(path.with_name(path.name + ".json"), report)
    return report


def onnx_runner(path: str | Path, names: list[str]):
    """`router.export.golden.reproduce`'s run function for an ONNX decision graph (onnxruntime, CPU)."""
    ort = _need("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}  # the exporter drops inputs the graph does not read

    def run(alpha, inputs):
        feed = {n: (alpha if n == "alpha" else inputs[n]).numpy() for n in names if n in wanted}
        return session.run(None, feed)

    return run
