"""Router training data over record folders: the core's record view plus labels and weights.

Inputs come from `router.offline.inputs.RecordView` (the same code eval scores routers with): the
feature vector per row, plus hidden states read batch by batch from the memory-mapped shards;
the GRU arch gets each row with its window-1 predecessors of the same trajectory. For the token
head a row is a position with its K recorded drafter candidates: inputs (K, D + 5), labels (K,),
weights q(v) (how often v is drafted there). `RecordDataModule` serves both to Lightning.
"""

from __future__ import annotations

import warnings

import lightning as L
import numpy as np
import torch

from router.offline.inputs import RecordView
from router.records import load_records, read_manifest, require_hidden_states
from train.labels import (
    ANSWER_TARGETS,
    CONSEQUENCE_TARGET,
    HORIZON_TARGET,
    JUDGE_TARGET,
    SIGNED_TARGET,
    TOKEN_TARGET,
    labels,
    weights,
)


class RecordSplit(RecordView):
    """One split of record folders with the router's labels y and weights w."""

    def __init__(
        self,
        folders: list[str],
        split: str,
        mode: str,
        target: str,
        hidden_inputs: list[str],
        window: int = 1,
        max_rows: int | None = None,
        head: str = "cascade",
        examples: set | None = None,
        arch=None,
    ):
        if (head == "token") != (target == TOKEN_TARGET):
            raise ValueError(
                f"target {target!r} with head {head!r}: the token head learns target {TOKEN_TARGET} "
                f"and that target needs head: token"
            )
        if head == "judge" and target not in (JUDGE_TARGET, *ANSWER_TARGETS):
            raise ValueError(
                f"target {target!r} with head judge: a judge decides the drafter's argmax d and learns "
                f"{JUDGE_TARGET} ([argmax p = y] - [d = y], the greedy gap of keeping d) or "
                f"{CONSEQUENCE_TARGET} (whether keeping d changes the answer), {SIGNED_TARGET} (the accuracy keeping d "
                f"loses: +1 harm, -1 rescue) or {HORIZON_TARGET}"
            )
        if mode == "consequence" and target not in ANSWER_TARGETS or target in ANSWER_TARGETS and mode != "consequence":
            raise ValueError(
                f"target {target!r} with mode {mode!r}: consequence and short-horizon labels exist on "
                f"consequence-mode rows only: use target {' or '.join(ANSWER_TARGETS)} with mode consequence"
            )
        super().__init__(folders, split, mode, tuple(hidden_inputs), max_rows, examples)
        self.head, self.window, self.hidden_inputs = head, window, tuple(hidden_inputs)
        self.arch = arch  # which extra judge inputs it reads (router/inputs.py); None: none
        self.y = self.cand.labels.astype(np.float32) if head == "token" else labels(self.cols, target)  # (N,) | (N, K)
        self.w = self.cand.q.astype(np.float32) if head == "token" else weights(self.cols, target)

    def batch_inputs(self, idx: np.ndarray, window: int | None = None) -> np.ndarray:
        """What the router being trained reads for these rows (a GRU's `window` positions each, or `window`)."""
        window = self.window if window is None else window
        return self.inputs(idx, self.head, window, self.hidden_inputs, arch=self.arch)

    def flat_inputs(self, idx: np.ndarray) -> np.ndarray:
        """Inputs without GRU windows, one row per position or per token-head candidate: (n [* K], D)."""
        x = self.batch_inputs(idx, window=1)
        return x.reshape(-1, x.shape[-1])


def warn_if_one_sided(train: RecordSplit) -> None:
    """Warn when the training labels cannot teach a decision (all on one side of 0)."""
    if len(np.unique(train.y > 0)) < 2:
        warnings.warn(
            "every training label falls on one side of 0 (no position where deferring pays, or all do): "
            "the router will be trivial; record more or other data"
        )


def input_stats(train: RecordSplit) -> tuple[np.ndarray, np.ndarray]:
    """The network's input (mean, std), from (a sample of) the training rows."""
    idx = np.random.default_rng(0).permutation(len(train))[:20000]
    x = train.flat_inputs(np.sort(idx))  # token head: every candidate
    return x.mean(0), x.std(0) + 1e-6


def hidden_size(folder: str, role: str) -> int:
    """Width of the drafter's/verifier's hidden states (or "after": the verifier's after the drafted
    token) recorded in a folder."""
    require_hidden_states(folder, read_manifest(folder), role)
    first = load_records(folder, split="train").select_columns([f"{role}_hidden"])[0]
    return len(first[f"{role}_hidden"])


def rank_share(batches: list) -> list:
    """This rank's batches under DDP (batch i to rank i mod world), the same number on every rank (the
    last world - 1 batches of an epoch may be dropped; the epoch's shuffle differs each time). The
    whole list in one process. Every rank shuffles with the same seed, so the shares are disjoint."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return batches
    rank, world = dist.get_rank(), dist.get_world_size()
    per_rank = len(batches) // world
    return batches[rank::world][:per_rank]


class BatchIterable(torch.utils.data.IterableDataset):
    """Shuffled (or ordered) batches of (x, y, weight, idx) over a RecordSplit. Under DDP training
    batches are shared out by rank; validation batches are not: every rank scores the whole split, so
    the validation areas (what checkpointing and early stopping read) are computed on all of it and
    are the same on every rank."""

    def __init__(self, data: RecordSplit, batch_size: int, shuffle: bool, seed: int):
        super().__init__()
        self.data, self.batch_size, self.shuffle, self.seed = data, batch_size, shuffle, seed
        self.epoch = 0

    def __iter__(self):
        n = len(self.data)
        order = np.random.default_rng(self.seed + self.epoch).permutation(n) if self.shuffle else np.arange(n)
        self.epoch += 1
        starts = list(range(0, n, self.batch_size))
        if self.shuffle:  # training under DDP: each rank its share of the epoch's batches
            starts = rank_share(starts)
        for start in starts:
            idx = order[start : start + self.batch_size]
            yield (
                torch.from_numpy(np.ascontiguousarray(self.data.batch_inputs(idx))),
                torch.from_numpy(self.data.y[idx]),
                torch.from_numpy(self.data.w[idx]),
                torch.from_numpy(idx),
            )


class RecordDataModule(L.LightningDataModule):
    """Train/validation splits of record folders as Lightning dataloaders (batches built from the
    memory-mapped shards, shuffled per epoch with the seed)."""

    def __init__(
        self,
        folders: list[str],
        mode: str,
        target: str,
        hidden_inputs: list[str],
        batch_size: int,
        seed: int,
        window: int = 1,
        head: str = "cascade",
        max_train_rows: int | None = None,
        examples: dict | None = None,
        arch=None,
    ):
        """examples: {"train": ids, "validation": ids} to fit on those examples of every split (a
        cross-fitting fold) instead of the records' train and validation splits."""
        super().__init__()
        self.examples = examples
        self.args = dict(
            folders=folders,
            mode=mode,
            target=target,
            hidden_inputs=hidden_inputs,
            window=window,
            head=head,
            arch=arch,
        )
        self.batch_size, self.seed, self.max_train_rows = batch_size, seed, max_train_rows
        self.train: RecordSplit | None = None
        self.val: RecordSplit | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train is None:
            if self.examples is None:
                self.train = RecordSplit(split="train", max_rows=self.max_train_rows, **self.args)
                self.val = RecordSplit(split="validation", **self.args)
            else:
                train, val = (set(self.examples[k]) for k in ("train", "validation"))
                self.train = RecordSplit(split="all", max_rows=self.max_train_rows, examples=train, **self.args)
                self.val = RecordSplit(split="all", examples=val, **self.args)
            self._batches = self._batch_iterables()

    def reseeded(self, seed: int) -> "RecordDataModule":
        """The same splits (read once, shared) with their batches shuffled by another seed: what each
        member of a seed ensemble trains on, without reading the records again per member."""
        self.setup("fit")
        twin = RecordDataModule(
            batch_size=self.batch_size,
            seed=seed,
            max_train_rows=self.max_train_rows,
            examples=self.examples,
            **self.args,
        )
        twin.train, twin.val = self.train, self.val
        twin._batches = twin._batch_iterables()
        return twin

    def _batch_iterables(self) -> dict:
        # built once per module: the training iterable counts epochs to reshuffle each one differently
        return {
            name: BatchIterable(data, self.batch_size, name == "train", self.seed)
            for name, data in (("train", self.train), ("val", self.val))
        }

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self._batches["train"], batch_size=None)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(self._batches["val"], batch_size=None)
