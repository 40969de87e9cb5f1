"""The `specroute` command. Subcommands reach the stages lazily, so `router` never imports them.

specroute generate --prompt "..."   decode with a speculative cascade, marking who wrote what
specroute gen --config configs/gen/tiny.yaml [key=value ...]   record token-level data
specroute train --config configs/train/tiny.yaml [key=value ...] fit and export a router
specroute eval --config configs/eval/tiny.yaml [key=value ...]  routers vs plug-in rules, offline + online
specroute demo [--preset tiny|cpu|long|gpu] [--engine auto|torch|llamacpp] [--fresh]   the whole pipeline, resumable
specroute rules                     list the deferral rules and their alpha ranges
specroute snapshot SRC DST          a readable copy of a recording in progress (its finished shards)
specroute best-router A B --records R --out O   the best cross-fitted router per fold vs the best rule
"""

from __future__ import annotations

import argparse
import errno
import sys
from pathlib import Path

from router.infra import clock
from router.infra.quiet import command_output
from router.loop.options import add_decode_flags
from router.rules import get_rule, rule_names
from specroute.presets import engine_choices
from specroute.folder_cmds import add_folder_parsers, cmd_best_router, cmd_snapshot
from specroute.generate_cmd import add_generate_parser, cmd_generate


def _labels_parser(sub) -> None:
    """`specroute labels export | show`."""
    labels = sub.add_parser("labels", help="answer-level labels as a file: export, or show one (data_gen)")
    labels_sub = labels.add_subparsers(dest="labels_command", required=True)
    export = labels_sub.add_parser("export", help="a record folder's consequence labels -> a label file")
    export.add_argument("folder", help="a finished record folder with consequence rows")
    export.add_argument("file", help="the label file to write (gzip JSON lines, e.g. labels/gsm8k.jsonl.gz)")
    export.add_argument(
        "--add-only",
        action="store_true",
        help="keep FILE's entries exactly as they are and append only the folder's examples it does not hold",
    )
    show = labels_sub.add_parser("show", help="what a label file holds")
    show.add_argument("file")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specroute", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_generate_parser(sub)
    sub.add_parser("rules", help="list the deferral rules and their alpha ranges")
    gen = sub.add_parser("gen", help="record drafter/verifier distributions on task data (data_gen)")
    gen.add_argument("--config", help="YAML config, e.g. configs/gen/gsm8k.yaml")
    gen.add_argument("--overwrite", action="store_true", help="redo a complete or partial output folder")
    gen.add_argument("overrides", nargs="*", help="key=value overrides, e.g. max_examples=50 batch_size=8")
    train = sub.add_parser("train", help="fit a deferral router on record folders (train)")
    train.add_argument("--config", help="YAML config, e.g. configs/train/mlp.yaml")
    train.add_argument("overrides", nargs="*", help="key=value overrides, e.g. arch=gru max_epochs=5")
    demo = sub.add_parser("demo", help="the whole pipeline: gen -> train -> eval on the embedded pair")
    demo.add_argument(
        "--preset",
        default="cpu",
        choices=["tiny", "cpu", "long", "gpu"],
        help="tiny: random models, under a minute; cpu: the real pair on a CPU (prints the time it "
        "expects here); long: cpu with 50 online prompts per task (hours, resumable); gpu: bigger",
    )
    demo.add_argument("--output", help="folder for everything (default runs/demo/<preset>)")
    demo.add_argument("--fresh", action="store_true", help="start over instead of reusing finished stages")
    demo.add_argument(
        "--engine",
        default="auto",
        choices=engine_choices(),
        help="what runs the models: auto prices the cpu preset's stages on torch, on llama.cpp (where "
        "llama-cpp-python is installed) and its evaluation in vLLM (where the demo runs in .venv-vllm) and runs "
        "each on the faster one; torch for the other presets; vllm: evaluate in vLLM, record on torch",
    )
    demo.add_argument("--threads", type=int, default=0, help="llamacpp: threads per model (0: chosen from the machine)")
    add_decode_flags(demo, None, only=("gamma", "draft_stop", "bonus_from"))  # unset: the preset's
    onnx = sub.add_parser("export-onnx", help="a router's decision as ONNX, checked on its golden vectors")
    onnx.add_argument("folder", help="an exported router folder (e.g. runs/demo/cpu/routers/mlp)")
    onnx.add_argument("--output", help="the .onnx file to write (default FOLDER/decision.onnx)")
    onnx.add_argument(
        "--refresh-golden",
        action="store_true",
        help="write the folder's golden vectors again from its current weights first (after you changed them)",
    )
    _labels_parser(sub)
    add_folder_parsers(sub)
    prompts = sub.add_parser("prompts", help="held-out online prompts: the task's examples no record folder recorded")
    prompts.add_argument("folders", nargs="+", help="record folders of one task (the routers' and alphas' records)")
    prompts.add_argument("--output", required=True, help="the JSON-lines file to write (eval: prompts=FILE)")
    prompts.add_argument("--max", type=int, default=None, help="at most this many, in task order (default: all)")
    ev = sub.add_parser("eval", help="routers vs every plug-in rule, offline on records and online (eval)")
    ev.add_argument("--config", help="YAML config, e.g. configs/eval/gsm8k.yaml")
    ev.add_argument("overrides", nargs="*", help="key=value overrides, e.g. max_prompts=5 online=false")
    return parser


def cmd_demo(args) -> int:
    from specroute.demo import run_demo

    run_demo(
        args.preset,
        args.output,
        args.fresh,
        gamma=args.gamma,
        draft_stop=args.draft_stop,
        bonus_from=args.bonus_from,
        engine=args.engine,
        threads=args.threads,
    )
    return 0


def cmd_eval(args) -> int:
    from router.infra.config import load_config
    from eval.run import EvalConfig, run_eval

    run_eval(load_config(EvalConfig, args.config, list(args.overrides)))
    return 0


def cmd_train(args) -> int:
    from router.infra.config import load_config
    from train.config import TrainConfig
    from train.run import run_train

    run_train(load_config(TrainConfig, args.config, list(args.overrides)))
    return 0


def cmd_gen(args) -> int:
    from data_gen.config import GenConfig
    from data_gen.run import run_gen
    from router.infra.config import load_config

    overrides = list(args.overrides) + (["overwrite=true"] if args.overwrite else [])
    cfg = load_config(GenConfig, args.config, overrides)
    manifest = run_gen(cfg)
    print(f"  records written to {cfg.output} ({len(manifest.shards)} shards + manifest.json)")
    return 0


def cmd_labels(args) -> int:
    from data_gen.label_store import LabelStore, describe, export_labels

    if args.labels_command == "export":
        if not (Path(args.folder) / "manifest.json").exists():
            raise ValueError(
                f"{args.folder} has no manifest.json (a recording still in progress?): copy its finished shards "
                f"with `specroute snapshot {args.folder} SNAPSHOT` and export the snapshot"
            )
        header = export_labels(args.folder, args.file, add_only=args.add_only)
        added = f" ({header['added']} examples added, the others kept as they were)" if args.add_only else ""
        print(f"{args.file}: {describe(header)}{added}")
        print(f"  replay them into a recording with labels_from={args.file} (`specroute gen`)")
    else:
        from data_gen.label_summary import signed_summary, summary_lines

        store = LabelStore(args.file)
        print(f"{args.file}: {describe(store.header)}")
        print("\n".join(summary_lines(signed_summary(store.entries.values()))))
    return 0


def cmd_prompts(args) -> int:
    from data_gen.prompts import write_prompts

    if args.max is not None and args.max < 1:
        raise ValueError(f"--max is how many prompts to write, at least 1; got {args.max}")
    rows = write_prompts(args.folders, args.output, args.max)
    splits = {s: sum(r["split"] == s for r in rows) for s in sorted({r["split"] for r in rows})}
    print(f"{args.output}: {len(rows)} unrecorded examples in task order (split rule: {splits})")
    print(f"  decode them online with `specroute eval ... prompts={args.output} max_prompts=N`")
    return 0


def cmd_export_onnx(args) -> int:
    from router.export.onnx import export_onnx
    from router.infra.console import summary_table

    try:
        report = export_onnx(args.folder, args.output, refresh_golden=args.refresh_golden)
    except ImportError as err:
        raise SystemExit(f"error: {err}") from None
    rows = [
        ("onnx graph", report["onnx"]),
        ("inputs", ", ".join(report["inputs"])),
        ("outputs", ", ".join(report["outputs"])),
        ("golden vectors", f"{report['checked']} values; decisions equal: {report['decisions_equal']}"),
        ("largest score error", f"{report['max_score_error']:.3g} (|onnxruntime - torch| / max(1, |torch|))"),
    ]
    print(summary_table(rows) + f"\n  check written to {report['onnx']}.json")
    return 0 if report["ok"] else 1


def cmd_rules(_args) -> int:
    w = max(len(n) for n in rule_names()) + 1
    print(f"{'rule':<{w}} {'form':<8} {'alpha: lossless end -> drafter end':<36} decision")
    for name in rule_names():
        rule = get_rule(name)
        rng = "(alpha unused)" if rule.alpha_range is None else f"{rule.alpha_range[0]} -> {rule.alpha_range[1]}"
        print(f"{name:<{w}} {rule.form:<8} {rng:<36} {rule.description}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {
        "generate": cmd_generate,
        "rules": cmd_rules,
        "gen": cmd_gen,
        "train": cmd_train,
        "eval": cmd_eval,
        "demo": cmd_demo,
        "export-onnx": cmd_export_onnx,
        "labels": cmd_labels,
        "prompts": cmd_prompts,
        "snapshot": cmd_snapshot,
        "best-router": cmd_best_router,
    }
    clock.pause_aware()  # Ctrl-Z / kill -TSTP pauses a long run without the pause counting in its latencies
    try:
        with command_output(args.command):  # third-party bars and warnings to a log; specroute's notes one line each
            return handlers[args.command](args)
    except (FileNotFoundError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk or a read-only place while writing: every file is written atomically
        if err.errno not in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT, errno.EFBIG):
            raise
        # a copy or move (a library's atomic save) names its temporary first and the file it writes second
        target = err.filename2 or err.filename
        where = f" while writing {target}" if target else ""
        fix = (
            "raise the file size limit (`ulimit -f`)"
            if err.errno == errno.EFBIG
            else "free some space (or make it writable)"
        )
        print(
            f"error: {err.strerror}{where}: {fix} and rerun the same command; finished work is kept and the run "
            f"resumes after it",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
