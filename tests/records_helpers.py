"""Hand-built record folders from full distributions over a small vocabulary (tests only)."""

from __future__ import annotations

import numpy as np
import torch

from router.features import FEATURE_NAMES, token_features
from router.records import Manifest, rows_to_table, write_manifest, write_shard


def synthetic_token_records(folder, n_examples=60, positions=30, vocab=6, seed=0, manifest_extra=None, keep=None):
    """Records over a vocab of 6 where the gold token is the verifier's argmax 90% of the time:
    keeping exactly the verifier's favourite candidate (what token_v2 does at alpha 0) is right."""
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
        name = f"{split}-00000.arrow"
        write_shard(folder, name, rows_to_table(cols))
        shards.append({"file": name, "split": split, "rows": n})
    write_manifest(
        folder,
        Manifest(
            **{
                "shards": shards,
                "feature_names": list(FEATURE_NAMES),
                "hidden_states": "none",
                "task": "syn",
                **(manifest_extra or {}),
            }
        ),
    )
    return folder
