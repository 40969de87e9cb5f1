"""Router inputs from records: the one place that turns record folders into what routers read.

Training (train/) and offline evaluation (eval/) both read records through `RecordView`, and both
score routers with `router_scores`, so a router sees exactly the same inputs when it is fitted,
validated and evaluated (no train/eval skew). A view holds one split and mode of one or more
record folders: the scalar columns curves need, the drafter's recorded top-k candidates, the
feature vectors, trajectory keys, and the models' hidden states read from the memory-mapped shards
on demand. Router inputs per row are
  position inputs (D,)        features, then the hidden states the router reads (in its order);
  windows (window, D)         a position with its window-1 predecessors of the same trajectory;
  candidate inputs (K, D + 5) the position inputs next to each candidate's own features.
In the decoding loop `router.model.LearnedRouter` builds the same inputs from full distributions
with the same functions (`router.features`).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from router.inputs import judge_inputs
from router.features import FEATURE_NAMES, class_bits, judge_features
from router.features import recorded_candidate_features
from router.model import LearnedRouter, RouterError, RouterNet, check_router_pair
from router.records import (
    RecordsError,
    judge_column,
    load_records,
    read_manifest,
    read_token_classes,
    require_hidden_states,
    require_judge,
)
from router.offline.tradeoff import CANDIDATE_COLUMNS, candidates_from_columns
from router.window.follow import FollowWindow, block_followers, cut_window, window_of_rows
from router.window.lag import predecessor_rows

JUDGE_COLUMNS = (
    "draft_token",
    "q_draft",
    "p_draft",
    judge_column("argmax", "lookahead"),
    judge_column("sample", "lookahead"),
)
VIEW_COLUMNS = (
    "q_max",
    "p_max",
    "tv",
    "kl",
    "p_entropy",
    "q_token",
    "p_token",
    "q_argmax",
    "p_argmax",
    "token",
    "position",
)


def _only_examples(ds, examples: set):
    """The rows of these example ids (an index selection: rows of a trajectory stay consecutive)."""
    ids = np.asarray(ds.select_columns(["example_id"])[:]["example_id"]).astype(str)  # through ds's own index
    return ds.select(np.nonzero(np.isin(ids, np.asarray(sorted(examples), dtype=str)))[0])


class RecordView:
    """One split and mode of record folders, concatenated in folder order (rows of a trajectory
    stay consecutive and in position order)."""

    head: str | None = None  # the router head its labels are for (train.data.RecordSplit sets it)

    def __init__(
        self,
        folders: list[str],
        split: str,
        mode: str = "gold",
        hidden_inputs: tuple = (),
        max_rows: int | None = None,
        examples: set | None = None,
    ):
        """hidden_inputs: hidden states the folders must hold (checked now, read later, on demand).
        split "all" reads every split; `examples` keeps only those example ids (cross-fitting folds,
        router.offline.folds)."""
        import datasets

        self.folders, self.split, self.mode = list(folders), split, mode
        self.manifests, parts = [], []
        for folder in self.folders:
            manifest = read_manifest(folder)
            if manifest.feature_names != list(FEATURE_NAMES):
                raise RecordsError(
                    f"{folder} was recorded with features {manifest.feature_names}, this "
                    f"specroute uses {list(FEATURE_NAMES)}: re-record it"
                )
            for role in hidden_inputs:
                require_hidden_states(folder, manifest, role)
            self.manifests.append(manifest)
            if split != "all" and not any(s["split"] == split for s in manifest.shards):
                continue  # this folder recorded no example of that split (a damaged shard is an error below)
            part = load_records(folder, split=None if split == "all" else split, mode=mode)
            parts.append(part if examples is None else _only_examples(part, examples))
        if not parts or not sum(len(p) for p in parts):
            chosen = "" if examples is None else f" among the {len(examples)} examples asked for"
            raise RecordsError(
                f"no {mode}-mode rows in the {split} split of {self.folders}{chosen}: record with modes "
                f"including {mode} and enough examples for a {split} split"
            )
        ds = datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]
        if max_rows is not None and len(ds) > max_rows:
            ds = ds.select(range(max_rows))
        self.ds = ds.with_format("numpy")
        small = self.ds.select_columns(sorted({*VIEW_COLUMNS, *CANDIDATE_COLUMNS, "features", "example_id", "mode"}))[:]
        self.cols = {k: np.asarray(small[k]) for k in VIEW_COLUMNS}  # (N,) each
        for name in ("consequence", "answer_correct", "horizon_score"):  # answer-level labels, where recorded
            if name in self.ds.column_names:
                self.cols[name] = np.asarray(self.ds.select_columns([name])[:][name])
        self.cand = candidates_from_columns(small)  # the drafter's top-k, column 0 = its argmax
        self.features = np.asarray(small["features"], dtype=np.float32)  # (N, F)
        self.traj = np.char.add(np.asarray(small["example_id"]).astype(str), np.asarray(small["mode"]).astype(str))
        self._cand_x = None
        self._judge_cols = None
        self._windows = None  # (N, (1 + W) * C) the recorded window column, read on first use
        self._followers: dict = {}  # block size -> (N,) drafts following each row in such a block (seeded)
        self.token_classes: np.ndarray | None = None  # (V,) class bits, once judge inputs are read

    def __len__(self) -> int:
        return len(self.features)

    @property
    def q_top1(self) -> np.ndarray:
        """(N,) 1 where the drafter's argmax is the trajectory's token."""
        return (self.cols["q_argmax"] == self.cols["token"]).astype(np.float64)

    @property
    def p_top1(self) -> np.ndarray:
        return (self.cols["p_argmax"] == self.cols["token"]).astype(np.float64)

    # ---- router inputs ----------------------------------------------------------------------------
    def hidden(self, idx: np.ndarray, roles: tuple, drafted: str = "argmax") -> np.ndarray | None:
        """(len(idx), H) these hidden states, concatenated in order, read from the shards: the
        drafter's/verifier's before the position, or "after": the verifier's after reading the
        drafted token (the drafter's argmax, or its recorded sample with drafted="sample")."""
        if not roles:
            return None
        for folder, manifest in zip(self.folders, self.manifests):
            for role in roles:
                require_hidden_states(folder, manifest, role)
        columns = [judge_column(drafted, "hidden") if role == "after" else f"{role}_hidden" for role in roles]
        order = np.argsort(idx)  # sorted reads are sequential on the memory map
        got = self.ds.select_columns(columns)[np.asarray(idx)[order].tolist()]
        out = np.concatenate([np.asarray(got[c], dtype=np.float32) for c in columns], -1)
        return out[np.argsort(order)]

    def position_inputs(self, idx: np.ndarray, hidden: tuple = ()) -> np.ndarray:
        """(len(idx), D): features, then the hidden states of the models named in `hidden`."""
        h = self.hidden(idx, tuple(hidden))
        return self.features[idx] if h is None else np.concatenate([self.features[idx], h], -1)

    def window_inputs(self, idx: np.ndarray, window: int, hidden: tuple = ()) -> np.ndarray:
        """(len(idx), window, D): each row with its predecessors in the same trajectory, zero-padded."""
        safe, valid = predecessor_rows(self.traj, idx, np.arange(window - 1, -1, -1))  # (n, window) oldest first
        rows, where = np.unique(safe, return_inverse=True)  # read each needed row once
        out = self.position_inputs(rows, hidden)[where.reshape(-1)].reshape(len(idx), window, -1)
        return np.where(valid[..., None], out, 0.0).astype(np.float32)

    def candidate_inputs(self, idx: np.ndarray, hidden: tuple = ()) -> np.ndarray:
        """(len(idx), K, D + 5): position inputs next to each recorded candidate's features."""
        if self._cand_x is None:
            self._cand_x = recorded_candidate_features(self.cand).numpy()  # (N, K, 5)
        x, c = self.position_inputs(idx, hidden), self._cand_x[idx]
        return np.concatenate([np.broadcast_to(x[:, None], (*c.shape[:2], x.shape[-1])), c], -1)

    def judge_columns(self) -> dict:
        """The drafted tokens' columns a judge reads (argmax and sample), loaded once."""
        if self._judge_cols is None:
            tables = []
            for folder, manifest in zip(self.folders, self.manifests):
                require_judge(folder, manifest)
                tables.append(read_token_classes(folder, manifest))
            if any(t.shape != tables[0].shape or (t != tables[0]).any() for t in tables):
                raise RecordsError(
                    f"{self.folders} were recorded with different token class tables: a judge "
                    f"reads one tokenizer's classes; use folders of one model pair"
                )
            self.token_classes = tables[0]
            got = self.ds.select_columns(list(JUDGE_COLUMNS))[:]
            self._judge_cols = {c: np.asarray(got[c]) for c in JUDGE_COLUMNS}
        return self._judge_cols

    def drafted(self, drafted: str = "argmax") -> np.ndarray:
        """(N,) the drafted token a judge decides: the drafter's argmax, or its recorded sample."""
        return self.cols["q_argmax"] if drafted == "argmax" else self.judge_columns()["draft_token"]

    def has_windows(self, width: int) -> bool:
        """Every folder holds window inputs of one recorded width, at least `width` following drafts."""
        recorded = {m.window for m in self.manifests}
        return "window" in self.ds.column_names and len(recorded) == 1 and min(recorded) >= width

    def follow_windows(self, idx: np.ndarray, width: int, block: int = 0) -> FollowWindow:
        """The recorded windows (data_gen/window.py) of the drafter's argmax at these rows: FollowWindow
        (len(idx),); rows without one (the drafter agreed with the verifier) are all invalid. block > 0:
        each cut as a block of that many drafts cuts it (router.window.follow.block_followers, seeded per view)."""
        recorded = sorted({m.window for m in self.manifests})
        if not self.has_windows(width):
            raise RecordsError(
                f"{self.folders} hold windows of {recorded} following drafts, a window judge reads {width}: "
                f"record them with window={width} (or more), all folders alike"
            )
        if self._windows is None:  # read the column once per view: rules and judges index into it
            self._windows = np.asarray(self.ds.select_columns(["window"])[:]["window"], np.float32)
        window = window_of_rows(self._windows[np.asarray(idx)], recorded[0])
        if not block:
            return window
        if block not in self._followers:
            self._followers[block] = block_followers(len(self), block)
        return cut_window(window, torch.from_numpy(self._followers[block][np.asarray(idx)]))

    def judge_inputs(
        self, idx: np.ndarray, hidden: tuple = (), drafted: str = "argmax", arch=None, **sizes
    ) -> np.ndarray:
        """(len(idx), D) a judge's inputs for the drafted token at these rows (router.features.judge_features),
        then the extra inputs `arch` switches on (router/inputs.py, in its order: a window of the drafts after it,
        the `lag` rows before it on its trajectory, the sums over every row before it...), then hidden states.
        `arch` is a RouterArch (or RouterConfig); keyword sizes (follow=4, lag=2, running=True...) stand for one."""
        arch = input_settings(arch, **sizes)
        j, c = self.judge_columns(), self.cols
        d = self.drafted(drafted)[idx]
        look = j[judge_column(drafted, "lookahead")][idx]
        if drafted == "argmax":
            d_q, d_p = self.cand.q[idx, 0], self.cand.p[idx, 0]
        else:
            d_q, d_p = j["q_draft"][idx], j["p_draft"][idx]
        t = torch.from_numpy
        x = judge_features(
            t(self.features[idx]),
            t(np.asarray(d_q, np.float32)),
            t(np.asarray(d_p, np.float32)),
            t(d == c["p_argmax"][idx]),
            t(d == c["q_argmax"][idx]),
            t(np.asarray(look)),
            class_bits(t(self.token_classes), t(np.asarray(d, np.int64))),
        ).numpy()
        for spec in judge_inputs(arch):  # each as router/inputs.py declares it, in its order
            x = np.concatenate([x, spec.offline(self, idx, arch, drafted).astype(x.dtype, copy=False)], -1)
        h = self.hidden(idx, tuple(hidden), drafted)
        return x if h is None else np.concatenate([x, h], -1)

    def inputs(
        self,
        idx: np.ndarray,
        head: str = "cascade",
        window: int = 1,
        hidden: tuple = (),
        drafted: str = "argmax",
        arch=None,
        **sizes,
    ) -> np.ndarray:
        """What a router with this head, GRU window (1 for other archs) and hidden inputs reads (a judge: for
        the drafted token `drafted`, with the extra inputs `arch` or the keyword sizes switch on)."""
        if head == "judge":
            return self.judge_inputs(idx, hidden, drafted, arch, **sizes)
        if head == "token":
            return self.candidate_inputs(idx, hidden)
        return self.window_inputs(idx, window, hidden) if window > 1 else self.position_inputs(idx, hidden)


def input_settings(arch=None, **sizes):
    """The object whose settings say which extra inputs a judge reads: `arch` itself, or the keyword sizes
    (follow=4, follow_block=2, lag=2, running=True, extra_inputs={...}) over no inputs at all."""
    if arch is not None and sizes:
        raise TypeError("give an arch or keyword input sizes, not both")
    if arch is not None:
        return arch
    return SimpleNamespace(**{"follow": 0, "follow_block": 0, "lag": 0, "running": False, "extra_inputs": {}, **sizes})


def input_window(net: RouterNet) -> int:
    """Positions of context a router network reads per row (1 unless it is a GRU)."""
    return net.cfg.window if net.cfg.arch == "gru" else 1


@torch.no_grad()
def router_scores(
    router: LearnedRouter | RouterNet,
    view: RecordView,
    batch: int = 8192,
    name: str = "router",
    drafted: str = "argmax",
) -> np.ndarray:
    """A router's predicted gaps on every row of a view: (N,) cascade head, (N, K) token head, (N,)
    judge head for the drafted token `drafted` (argmax or sample). A LearnedRouter is first checked
    against the view's model pair."""
    if isinstance(router, LearnedRouter):
        for manifest in view.manifests:
            check_router_pair(router.cfg, manifest, name)
        router = router.net
    k = view.cand.q.shape[1]
    if router.cfg.head == "token" and router.cfg.token_candidates != k:
        raise RouterError(
            f"token router {name} scores {router.cfg.token_candidates} candidates, the records hold "
            f"top-{k}: record with top_k={router.cfg.token_candidates} or retrain on these records"
        )
    net, window, hidden = router.eval(), input_window(router), tuple(router.cfg.hidden_inputs)
    parts, cfg = [], router.cfg
    for start in range(0, len(view), batch):
        idx = np.arange(start, min(start + batch, len(view)))
        x = view.inputs(idx, cfg.head, window, hidden, drafted, cfg)
        parts.append(net(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))))
    return torch.cat(parts).double().numpy()
