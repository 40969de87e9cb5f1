"""Router training data over record folders: small columns in RAM, hidden states memory-mapped.

Per row the router input is the feature vector (plus, when asked, the drafter's/verifier's hidden
state, read batch by batch from the memory-mapped Arrow shards, never copied whole into RAM);
the GRU arch gets each row with its window-1 predecessors of the same trajectory. For the token
head a row is a position with its K recorded drafter candidates: inputs (K, D + 5), labels (K,),
weights q(v) (how often v is drafted there). `RecordDataModule` serves both to Lightning.
"""

from __future__ import annotations

import lightning as L
import numpy as np
import torch

from router.features import FEATURE_NAMES
from router.model import recorded_candidate_features
from router.records import RecordsError, load_records, read_manifest, require_hidden_states
from router.tradeoff import candidates_from_columns
from train.targets import TOKEN_TARGET, labels

AUX = ("q_token", "p_token", "tv", "q_max", "p_max")  # what the validation metrics need


class RecordSplit:
    """One split of one or more record folders, concatenated."""

    def __init__(self, folders: list[str], split: str, mode: str, target: str, hidden_inputs: list[str],
                 window: int = 1, max_rows: int | None = None, head: str = "cascade"):
        import datasets

        parts = []
        for folder in folders:
            manifest = read_manifest(folder)
            if manifest["feature_names"] != list(FEATURE_NAMES):
                raise RecordsError(f"{folder} was recorded with features {manifest['feature_names']}, this "
                                   f"specroute uses {list(FEATURE_NAMES)}: re-record it")
            for role in hidden_inputs:
                require_hidden_states(folder, manifest, role)
            try:
                parts.append(load_records(folder, split=split, mode=mode))
            except RecordsError:
                continue  # this folder has no rows of that split
        if not parts:
            raise RecordsError(f"no {split} rows in mode {mode} in {folders}")
        ds = datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]
        if max_rows is not None and len(ds) > max_rows:
            ds = ds.select(range(max_rows))
        self.ds = ds.with_format("numpy")
        small = self.ds.select_columns(["features", "example_id", "mode", "position", "token", "q_argmax",
                                        "p_argmax", "q_topk_ids", "q_topk_logprobs", "p_at_q_topk_logprobs",
                                        *AUX])[:]
        self.features = np.asarray(small["features"], dtype=np.float32)  # (N, F)
        self.aux = {k: np.asarray(small[k], dtype=np.float64) for k in AUX}
        self.cand = candidates_from_columns(small)
        self.aux["cand"] = self.cand
        self.head = head
        if (head == "token") != (target == TOKEN_TARGET):
            raise ValueError(f"target {target!r} with head {head!r}: the token head learns target {TOKEN_TARGET} "
                             f"and that target needs head: token")
        self.y = self.cand.labels.astype(np.float32) if head == "token" else labels(small, target)  # (N,) | (N, K)
        self.w = self.cand.q.astype(np.float32) if head == "token" else np.ones(len(self.y), np.float32)
        self._cand_x = recorded_candidate_features(self.cand).numpy() if head == "token" else None  # (N, K, 5)
        self.hidden_inputs = list(hidden_inputs)
        self.window = window
        # rows of one trajectory (example + mode) are stored consecutively, in position order
        self.traj_key = np.char.add(np.asarray(small["example_id"]).astype(str), np.asarray(small["mode"]).astype(str))

    def __len__(self) -> int:
        return len(self.y)

    def hidden(self, idx: np.ndarray) -> np.ndarray | None:
        """(len(idx), H) concatenated hidden states of the given rows, read from the shards."""
        if not self.hidden_inputs:
            return None
        order = np.argsort(idx)  # sorted reads are sequential on the memory map
        got = self.ds[idx[order].tolist()]
        parts = [np.asarray(got[f"{role}_hidden"], dtype=np.float32) for role in self.hidden_inputs]
        out = np.concatenate(parts, -1)
        return out[np.argsort(order)]

    def position_inputs(self, idx: np.ndarray) -> np.ndarray:
        """Position inputs (len(idx), D): features then hidden states."""
        h = self.hidden(idx)
        return self.features[idx] if h is None else np.concatenate([self.features[idx], h], -1)

    def inputs(self, idx: np.ndarray) -> np.ndarray:
        """Router inputs: (len(idx), D), or (len(idx), K, D + 5) for the token head."""
        x = self.position_inputs(idx)
        if self._cand_x is None:
            return x
        c = self._cand_x[idx]  # (n, K, 5)
        return np.concatenate([np.broadcast_to(x[:, None], (*c.shape[:2], x.shape[-1])), c], -1)


def hidden_size(folder: str, role: str) -> int:
    """Width of the drafter's/verifier's hidden states recorded in a folder."""
    require_hidden_states(folder, read_manifest(folder), role)
    first = load_records(folder, split="train").select_columns([f"{role}_hidden"])[0]
    return len(first[f"{role}_hidden"])


class BatchIterable(torch.utils.data.IterableDataset):
    """Shuffled (or ordered) batches of (x, y, weight, idx) over a RecordSplit."""

    def __init__(self, data: RecordSplit, batch_size: int, shuffle: bool, seed: int, windowed: bool):
        super().__init__()
        self.data, self.batch_size, self.shuffle, self.seed, self.windowed = data, batch_size, shuffle, seed, windowed
        self.epoch = 0

    def __iter__(self):
        n = len(self.data)
        order = np.random.default_rng(self.seed + self.epoch).permutation(n) if self.shuffle else np.arange(n)
        self.epoch += 1
        for start in range(0, n, self.batch_size):
            idx = order[start: start + self.batch_size]
            x = window_inputs(self.data, idx) if self.windowed else self.data.inputs(idx)
            yield (torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(self.data.y[idx]),
                   torch.from_numpy(self.data.w[idx]), torch.from_numpy(idx))


def window_inputs(data: RecordSplit, idx: np.ndarray) -> np.ndarray:
    """(len(idx), window, D): each row with its predecessors in the same trajectory, zero-padded."""
    key, w = data.traj_key, data.window
    cand = idx[:, None] - np.arange(w - 1, -1, -1)[None]  # (n, w) oldest first
    valid = cand >= 0
    safe = np.where(valid, cand, 0)
    valid &= key[safe] == key[idx][:, None]
    rows, where = np.unique(safe, return_inverse=True)  # read each needed row once
    out = data.position_inputs(rows)[where.reshape(-1)].reshape(len(idx), w, -1)
    return np.where(valid[..., None], out, 0.0).astype(np.float32)


class RecordDataModule(L.LightningDataModule):
    """Train/validation splits of record folders as Lightning dataloaders (batches built from the
    memory-mapped shards, shuffled per epoch with the seed)."""

    def __init__(self, folders: list[str], mode: str, target: str, hidden_inputs: list[str], batch_size: int,
                 seed: int, window: int = 1, head: str = "cascade", max_train_rows: int | None = None):
        super().__init__()
        self.args = dict(folders=folders, mode=mode, target=target, hidden_inputs=hidden_inputs, window=window,
                         head=head)
        self.batch_size, self.seed, self.max_train_rows = batch_size, seed, max_train_rows
        self.train: RecordSplit | None = None
        self.val: RecordSplit | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train is None:
            self.train = RecordSplit(split="train", max_rows=self.max_train_rows, **self.args)
            self.val = RecordSplit(split="validation", **self.args)
            windowed = self.args["window"] > 1
            # built once: the training iterable counts epochs to reshuffle each one differently
            self._batches = {name: BatchIterable(data, self.batch_size, name == "train", self.seed, windowed)
                             for name, data in (("train", self.train), ("val", self.val))}

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self._batches["train"], batch_size=None)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(self._batches["val"], batch_size=None)
