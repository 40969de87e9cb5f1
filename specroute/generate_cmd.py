"""`specroute generate`: decode one prompt with a speculative cascade (a rule or a router folder) on either
engine, print it with the verifier's tokens marked, and write the result as JSON (docs/usage.md). Its parser
and command are wired into `specroute` by specroute/cli.py.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from router.backends import DEFAULT_ENGINE, backend_of, engine_names, get_engine
from router.loop.options import DecodeOptions, add_decode_flags, options_from_flags
from router.machine.hardware import DTYPE_CHOICES
from router.infra.stage_folders import OutputBusy, claim_output_file
from router.rules import get_rule, rule_names

VERIFIER_MARK = ("\033[1;33m", "\033[0m")  # bold yellow on a terminal
VERIFIER_BRACKETS = ("[[", "]]")  # elsewhere (pipes, files)


def add_generate_parser(sub) -> None:
    """`specroute generate`'s arguments, on the `specroute` subparsers."""
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
        default=DEFAULT_ENGINE,
        choices=engine_names(loop_only=True),
        help="torch (transformers) or llamacpp (the pair's GGUF files in llama.cpp, on the CPU; docs/usage.md)",
    )
    g.add_argument(
        "--threads",
        type=int,
        default=0,
        help="llamacpp: threads per model (0: the physical cores, 1 on a loaded machine)",
    )
    g.add_argument("--output", default="runs/generate/latest.json", help="where to write the JSON result")


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
            engine = get_engine(args.engine)
            if not engine.own_weights:
                raise
            raise ValueError(
                f"{err} (on {engine.label} a router trained on torch records of the embedded pair holds the same "
                f"weights, from the same files: --no-pair-check decodes it)"
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
    rows = _generate_rows(args, opts, stats, load_s, backend_of(verifier).setting(verifier))
    result = {
        "written_by": "specroute generate",  # a rerun may replace this file; no other file is written over
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
    try:  # a folder, a stage's folder, or a file generate did not write
        claim_output_file(args.output, "generate")
    except OutputBusy as err:
        raise SystemExit(f"error: {err}") from None
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError as err:  # bytes the shell's locale could not decode arrive as lone surrogates
        raise SystemExit(
            f"error: --prompt holds bytes that are not UTF-8 text (at character {err.start}): pass the prompt as UTF-8"
        ) from None
    if not args.prompt.strip() and not args.chat:
        raise SystemExit('error: --prompt is empty: give the text to continue, e.g. --prompt "def fib(n):"')
    _check_writable(Path(args.output))
    return opts, rule


def _check_writable(path: Path) -> None:
    """Refuse an --output that cannot be written before any model loads (generate has no resume to offer),
    creating nothing: a probe file in the nearest existing folder on its path, removed at once."""
    existing = next(p for p in [path.absolute().parent, *path.absolute().parents] if p.exists())
    probe = existing / f".{path.name}.probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise SystemExit(
            f"error: cannot write --output {path} ({existing}: {err.strerror or err}): choose a path you can write"
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
    from router.loop.baselines import generate_autoregressive
    from router.tasks.prompts import cut_at_stop

    base = generate_autoregressive(verifier, input_ids, attention_mask=mask, stop=stop, **opts.sampling_kwargs())
    speedup = stats["tokens_per_second"] / max(base.stats["tokens_per_second"], 1e-9)
    text = tokenizer.decode(base.sequences[0, input_ids.shape[1] :], skip_special_tokens=True)
    result["verifier_only"] = {"stats": base.stats, "text": cut_at_stop(text, stops)}
    return [
        ("verifier-only tokens / s", f"{base.stats['tokens_per_second']:.2f}"),
        ("speed-up vs verifier", f"{speedup:.2f}x"),
    ]
