"""`specroute snapshot` (a readable copy of a recording in progress) and `specroute best-router` (the best
cross-fitted router per fold against the best rule, out of fold): folder-to-folder steps of a user's workflow."""

from __future__ import annotations


def add_folder_parsers(sub) -> None:
    snap = sub.add_parser("snapshot", help="a recording in progress -> a readable copy of its finished shards")
    snap.add_argument("source", help="a record folder being recorded (gen_config.json, shards, no manifest yet)")
    snap.add_argument("dest", help="the new folder (must not exist)")
    snap.add_argument(
        "--leave-out", nargs="+", default=[], metavar="PATTERN", help="shard names (globs) not to copy: held out"
    )
    best = sub.add_parser("best-router", help="the best cross-fitted router per fold vs the best rule, out of fold")
    best.add_argument("folders", nargs="+", help="cross-fitted router folders on one fold plan (two or more)")
    best.add_argument("--records", nargs="+", required=True, help="the record folders to score on")
    best.add_argument("--reps", type=int, default=2000, help="bootstrap resamples")
    best.add_argument("--choose-by", default=None, help="the measure rules and routers are chosen by (e.g. signed)")
    best.add_argument("--out", required=True, help="the folder best_router.json goes to")


def cmd_snapshot(args) -> int:
    from data_gen.snapshot import snapshot_recording

    got = snapshot_recording(args.source, args.dest, args.leave_out)
    print(
        f"{args.dest}: {got['shards']} of {got['planned']} shards ({got['examples']} examples), manifest {got['manifest']}"
    )
    if got["consequence"]:
        print(f"  consequence labels: {got['consequence']}")
    if got["left_out_shards"]:
        print(
            f"  left out {got['left_out_shards']} shards ({got['left_out_examples']} examples): "
            f"`specroute prompts {args.dest}` lists them"
        )
    return 0


def cmd_best_router(args) -> int:
    from eval.best_router import best_router, table

    got = best_router(args.folders, args.records, args.out, args.reps, args.choose_by)
    print(f"Out of fold, population {got['population']} ({got['summary']['k']} folds):\n")
    print("\n".join(table(got["summary"])))
    print(f"wrote {got['path']}")
    return 0
