"""The `specroute` command. Subcommands reach the stages lazily, so `router` never imports them.

specroute generate --prompt "..."   decode with a speculative cascade, marking who wrote what
specroute gen --config configs/gen/tiny.yaml [key=value ...]   record token-level data
specroute train --config configs/train/tiny.yaml [key=value ...] fit and export a router
specroute eval --config configs/eval/tiny.yaml [key=value ...]  routers vs plug-in rules, offline + online
specroute demo [--preset tiny|cpu|long|gpu] [--engine auto|torch|llamacpp] [--fresh]   the whole pipeline, resumable
specroute rules                     list the deferral rules and their alpha ranges
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import time
from pathlib import Path

from router.infra import clock
from router.infra.quiet import command_output
from router.machine.hardware import DTYPE_CHOICES
from router.engine.options import DecodeOptions, add_decode_flags, options_from_flags
from router.rules import get_rule, rule_names

VERIFIER_MARK = ("\033[1;33m", "\033[0m")  # bold yellow on a terminal
VERIFIER_BRACKETS = ("[[", "]]")  # elsewhere (pipes, files)


def _generate_parser(sub) -> None:
    g = sub.add_parser("generate", help="decode one prompt with a speculative cascade")
    g.add_argument("--prompt", required=True, help="the prompt text")
    g.add_argument("--drafter", default="embedded:drafter", help="hub id, local folder, .gguf file or embedded:drafter")
    g.add_argument(
        "--verifier", default="embedded:verifier", help="hub id, local folder, .gguf file or embedded:verifier"
    )
    policy = g.add_mutually_exclusive_group()
    # no default here: argparse lets an explicit value equal to the default pass a mutually exclusive group
    policy.add_argument("--rule", choices=rule_names(), help="plug-in deferral rule (default: opt)")
    policy.add_argument(
        "--router", metavar="DIR", help="a trained router folder (specroute train's output) instead of a rule"
    )
    g.add_argument(
        "--no-pair-check",
        action="store_true",
        help="decode with a router on other models than it was trained on (refused by default)",
    )
    g.add_argument("--alpha", type=float, default=0.3, help="trade-off knob, see `specroute rules` for ranges")
    add_decode_flags(g, DecodeOptions())
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    g.add_argument("--compare", action="store_true", help="also decode with the verifier alone and report the speed-up")
    g.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPE_CHOICES,
        help="auto (default): bfloat16 where the hardware has it natively (CUDA, AMX, AVX512-BF16), float32 elsewhere",
    )
    g.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    g.add_argument(
        "--engine",
        default="torch",
        choices=("torch", "llamacpp"),
        help="torch (transformers) or llamacpp (the pair's GGUF files in llama.cpp, on the CPU; docs/usage.md)",
    )
    g.add_argument(
        "--threads",
        type=int,
        default=0,
        help="llamacpp: threads per model (0: the physical cores, 1 on a loaded machine)",
    )
    g.add_argument("--output", default="runs/generate/latest.json", help="where to write the JSON result")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specroute", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _generate_parser(sub)
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
        choices=["auto", "torch", "llamacpp"],
        help="what runs the models: auto prices the cpu preset's stages on torch and on llama.cpp (where "
        "llama-cpp-python is installed) and runs each on the faster one; torch for the other presets",
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
    labels = sub.add_parser("labels", help="answer-level labels as a file: export, or show one (data_gen)")
    labels_sub = labels.add_subparsers(dest="labels_command", required=True)
    export = labels_sub.add_parser("export", help="a record folder's consequence labels -> a label file")
    export.add_argument("folder", help="a finished record folder with consequence rows")
    export.add_argument("file", help="the label file to write (gzip JSON lines, e.g. labels/gsm8k.jsonl.gz)")
    show = labels_sub.add_parser("show", help="what a label file holds")
    show.add_argument("file")
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
                f"with `python studies/snapshot_records.py {args.folder} SNAPSHOT` and export the snapshot"
            )
        header = export_labels(args.folder, args.file)
        print(f"{args.file}: {describe(header)}")
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


def _encode(tokenizer, prompt: str, chat: bool, limit: int, device: str):
    """(input_ids, attention_mask) (1, T) of the prompt, cut from the left to `limit` tokens as
    recording cuts long prompts (with a warning)."""
    import torch

    from router.tasks.prompts import fit_prompt, prompt_text, warn_truncated

    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise SystemExit("error: --chat needs a tokenizer with a chat template; drop --chat for plain text")
    text = prompt_text(tokenizer, prompt, prompt, chat)
    ids, cut = fit_prompt(tokenizer.encode(text, add_special_tokens=False), limit)
    warn_truncated(int(cut), limit, "decoding")
    ids = torch.tensor([ids], device=device)
    return ids, torch.ones_like(ids)


def render_marked(tokenizer, tokens: list[int], sources: list[int], color: bool) -> str:
    """Decoded text with verifier-step tokens highlighted (colour on a terminal, [[..]] elsewhere)."""
    open_mark, close_mark = VERIFIER_MARK if color else VERIFIER_BRACKETS
    pieces, run, run_src = [], [], None
    for tok, src in zip(tokens, sources):
        if src < 0:
            break
        if run and src != run_src:
            pieces.append((run_src, tokenizer.decode(run)))
            run = []
        run.append(tok)
        run_src = src
    if run:
        pieces.append((run_src, tokenizer.decode(run)))
    return "".join(f"{open_mark}{text}{close_mark}" if src == 1 else text for src, text in pieces)


def cmd_generate(args) -> int:
    from router.decoding import generate
    from router.engine.llamacpp import engine_setting
    from router.infra.console import summary_table
    from router.infra.files import write_json
    from router.pair import load_pair
    from router.tasks.prompts import StopStrings, context_length, cut_at_stop, prompt_limit

    opts, policy = _generate_options(args)
    t0 = time.perf_counter()
    drafter, verifier, tokenizer = load_pair(
        args.drafter, args.verifier, args.dtype, args.device, engine=args.engine, threads=args.threads
    )
    load_s = time.perf_counter() - t0
    if policy.trained_pair and not args.no_pair_check:
        from router.pair import check_pair_is

        try:
            check_pair_is((drafter, verifier, tokenizer), policy.trained_pair, f"router {args.router}")
        except ValueError as err:
            if args.engine != "llamacpp":
                raise
            raise ValueError(
                f"{err} (on llama.cpp a router trained on torch records of the embedded pair holds the same weights, "
                f"from the same GGUF files: --no-pair-check decodes it)"
            ) from None
    limit = prompt_limit(context_length(drafter, verifier), opts.max_new_tokens)
    input_ids, mask = _encode(tokenizer, args.prompt, args.chat, limit, args.device)
    stops = opts.stop or []
    stop = StopStrings.build(tokenizer, stops)
    kwargs = dict(attention_mask=mask, stop=stop, check_pair=False, **opts.generate_kwargs())  # checked above
    out = generate(drafter, verifier, input_ids, rule=policy, alpha=args.alpha, **kwargs)
    new_tokens = out.sequences[0, input_ids.shape[1] :].tolist()
    sources = out.sources[0].tolist()
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    print(render_marked(tokenizer, new_tokens, sources, color))
    marker = "highlighted" if color else "in [[double brackets]]"
    print(f"\n(plain text: kept drafter tokens; {marker}: tokens from the verifier step)")
    stats = dict(out.stats)
    rows = _generate_rows(args, opts, stats, load_s, getattr(verifier, "dtype", None) or engine_setting(verifier))
    result = {
        "args": vars(args),
        "text": cut_at_stop(tokenizer.decode(new_tokens, skip_special_tokens=True), stops),
        "tokens": new_tokens,
        "sources": sources,
        "stats": stats,
    }
    if args.compare:
        rows += _compare_with_verifier(verifier, tokenizer, input_ids, mask, stop, stops, opts, stats, result)
    write_json(args.output, result)
    print("\n" + summary_table(rows) + f"\n  results written to {args.output}")
    return 0


def _generate_options(args):
    """`specroute generate`'s decoding options and policy (a rule, or a router folder loaded with
    torch alone), its alpha and its output path, checked before any language model is loaded."""
    try:
        if args.router:  # loaded (torch alone) and checked before any language model
            from router.model import load_router

            rule = load_router(args.router)
            if rule.offline_only:
                raise ValueError(rule.offline_only)
        else:
            args.rule = args.rule or "opt"
            rule = get_rule(args.rule)
        opts = options_from_flags(args)
        rule.check_alpha(args.alpha)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    if Path(args.output).is_dir():
        raise SystemExit(
            f"error: --output {args.output} is a folder: name the JSON file to write, e.g. "
            f"{Path(args.output) / 'result.json'}"
        )
    if not args.prompt.strip() and not args.chat:
        raise SystemExit('error: --prompt is empty: give the text to continue, e.g. --prompt "def fib(n):"')
    _check_writable(Path(args.output))
    return opts, rule


def _check_writable(path: Path) -> None:
    """Refuse an --output that cannot be written before any model loads (generate has no resume to offer)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = path.with_name(f".{path.name}.probe-{os.getpid()}")
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise SystemExit(
            f"error: cannot write --output {path} ({err.strerror or err}): choose a path you can write"
        ) from None


def _generate_rows(args, opts, stats: dict, load_s: float, dtype) -> list[tuple[str, str]]:
    """The summary table of one `specroute generate` run."""
    from router.machine.hardware import cpu_kind

    per_gamma = f" (blocks per gamma {stats['gamma_chosen']})" if "gamma_chosen" in stats else ""
    rows = [
        (
            "router" if args.router else "rule",
            f"{args.router or args.rule} (alpha {args.alpha}, gamma {opts.gamma}, temperature {opts.temperature})",
        ),
        ("new tokens", str(stats["new_tokens"])),
        ("tokens / s", f"{stats['tokens_per_second']:.2f}"),
        ("mean accepted / block", f"{stats['mean_accepted']:.2f} of {opts.gamma}{per_gamma}"),
    ]
    if stats.get("verifier_steps"):
        rows.append(
            (
                "verifier alone",
                f"{stats['verifier_steps']} steps: gamma auto found that speculation does not pay "
                f"here (acceptance estimate {stats['acceptance_estimate']:.3f})",
            )
        )
    return rows + [
        ("rejection rate", f"{stats['rejection_rate']:.3f}"),
        ("deferral rate", f"{stats['deferral_rate']:.3f}"),
        ("verifier calls / token", f"{stats['verifier_calls_per_token']:.3f}"),
        ("accepted-length histogram", str(stats["accepted_hist"])),
        ("model load seconds", f"{load_s:.1f}"),
        ("dtype / machine", f"{dtype} / {cpu_kind() if args.device == 'cpu' else args.device}"),
    ]


def _compare_with_verifier(verifier, tokenizer, input_ids, mask, stop, stops, opts, stats, result) -> list:
    """--compare: the verifier alone on the same prompt; its output goes into `result`, the speed-up
    into the returned summary rows."""
    from router.engine.baselines import generate_autoregressive
    from router.tasks.prompts import cut_at_stop

    base = generate_autoregressive(verifier, input_ids, attention_mask=mask, stop=stop, **opts.sampling_kwargs())
    speedup = stats["tokens_per_second"] / max(base.stats["tokens_per_second"], 1e-9)
    text = tokenizer.decode(base.sequences[0, input_ids.shape[1] :], skip_special_tokens=True)
    result["verifier_only"] = {"stats": base.stats, "text": cut_at_stop(text, stops)}
    return [
        ("verifier-only tokens / s", f"{base.stats['tokens_per_second']:.2f}"),
        ("speed-up vs verifier", f"{speedup:.2f}x"),
    ]


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
    }
    clock.pause_aware()  # Ctrl-Z / kill -TSTP pauses a long run without the pause counting in its latencies
    try:
        with command_output(args.command):  # third-party bars and warnings to a log; specroute's notes one line each
            return handlers[args.command](args)
    except (FileNotFoundError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk or a read-only place while writing: every file is written atomically
        if err.errno not in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT):
            raise
        # a copy or move (a library's atomic save) names its temporary first and the file it writes second
        target = err.filename2 or err.filename
        where = f" while writing {target}" if target else ""
        print(
            f"error: {err.strerror}{where}: free some space (or make it writable) and rerun the same command; "
            f"finished work is kept and the run resumes after it",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
