"""Window inputs in records: the tree-masked chains against plain forwards, rollout windows, the column."""

import json

import numpy as np
import pytest
import torch

from data_gen.config import GenConfig
from data_gen.recorder import Recorder
from data_gen.run import run_gen
from data_gen.window import mismatch_windows, rollout_windows
from router.loop.layout import Layout, cache_argument, left_pad
from router.loop.teacher import forward_tail
from router.records import load_records, read_manifest
from router.window.follow import DRAFT_SCALARS, block_window, draft_scalars, window_of_rows

VOCAB = 259
C = len(DRAFT_SCALARS)


def plain_window(drafter, verifier, prefix: list[int], d: int, width: int) -> np.ndarray:
    """(W, C) scalars of the drafter's greedy W tokens after prefix + [d], one plain forward per token."""
    seq = prefix + [d]
    for _ in range(width):
        seq.append(int(drafter(input_ids=torch.tensor([seq])).logits[0, -1, :VOCAB].argmax()))
    logits = verifier(input_ids=torch.tensor([seq])).logits[0, len(prefix) : len(prefix) + width, :VOCAB]
    return draft_scalars(torch.tensor([seq[len(prefix) + 1 :]]), logits[None].softmax(-1))[0].numpy()


@pytest.mark.parametrize("max_chain_tokens", [256, 6])
def test_chains_match_plain_forwards_per_mismatch(monkeypatch, max_chain_tokens, tiny):
    """Every chain sees its own gold prefix and its own earlier tokens (ragged, left-padded rows; the
    drafter's steps stay in its cache; chunked passes too), and the cache is left as it was."""
    import data_gen.window as window

    monkeypatch.setattr(window, "MAX_CHAIN_TOKENS", max_chain_tokens)
    drafter, verifier, tok = tiny
    prompts = [tok.encode("Q: 2+3?\nA:"), tok.encode("Hi")]
    conts = [tok.encode(" 5 because"), tok.encode(" there, you")]
    rng = np.random.default_rng(0)
    q_argmax = [np.where(rng.random(len(c)) < 0.6, rng.integers(3, VOCAB, len(c)), -1) for c in conts]
    ids, mask = left_pad([p + c for p, c in zip(prompts, conts)], 0)
    layout = Layout(ids, mask)
    keep, width = max(len(c) for c in conts) + 1, 3
    with torch.inference_mode():
        _, _, d_cache = forward_tail(drafter, layout, keep, VOCAB, False, cache=True)
        p_logits, _, v_cache = forward_tail(verifier, layout, keep, VOCAB, False, cache=True)
        p_argmax = [p_logits[b, keep - len(c) - 1 : keep - 1].argmax(-1).numpy() for b, c in enumerate(conts)]
        q_argmax = [np.where(q >= 0, q, p) for q, p in zip(q_argmax, p_argmax)]  # -1: agree with the verifier
        lengths = (d_cache.get_seq_length(), v_cache.get_seq_length())
        args = (cache_argument(drafter), cache_argument(verifier))
        cols = mismatch_windows(
            (drafter, verifier), (d_cache, v_cache), args, layout, p_logits, conts, q_argmax, width, VOCAB
        )
        assert (d_cache.get_seq_length(), v_cache.get_seq_length()) == lengths
        checked = 0
        for b, (prompt, cont) in enumerate(zip(prompts, conts)):
            rows = cols[b].reshape(len(cont), 1 + width, C)
            for t in range(len(cont)):
                if q_argmax[b][t] == p_argmax[b][t]:
                    assert np.isnan(rows[t]).all()
                    continue
                want = plain_window(drafter, verifier, prompt + cont[:t], int(q_argmax[b][t]), width)
                np.testing.assert_allclose(rows[t, 1:], want, atol=1e-4)
                assert rows[t, 0, 1] == 0  # the draft itself is a mismatch
                checked += 1
        assert checked >= 6


def test_rollout_windows_are_the_block_windows_of_the_trajectory():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 6, 11, generator=g)
    conts = [[1, 2, 3, 4, 5], [7, 8, 9]]
    cols = rollout_windows(logits, conts, 2)
    for b, cont in enumerate(conts):
        n = len(cont)
        p = logits[b, 6 - n - 1 : 5].softmax(-1)
        online = block_window(torch.tensor([cont]), p[None], 2)
        offline = window_of_rows(cols[b], 2)
        assert torch.allclose(offline.at, online.at[0]) and torch.allclose(offline.values, online.values[0])
        assert torch.equal(offline.valid, online.valid[0])  # past the trajectory's end: invalid


def test_recorded_window_column(tmp_path, tiny):
    data = tmp_path / "qa.jsonl"
    data.write_text(
        "".join(json.dumps({"id": f"q{i}", "q": f"Add {i} and 3.", "a": f" {i + 3}."}) + "\n" for i in range(6))
    )
    out = tmp_path / "rec"
    cfg = GenConfig(
        task="custom", data_path=str(data), prompt_field="q", reference_field="a", id_field="id",
        drafter="tiny:drafter", verifier="tiny:verifier", dtype="float32", batch_size=3,
        examples_per_shard=4, output=str(out), modes=["gold", "rollout"], rollout_max_new_tokens=6, window=2,
    )  # fmt: skip
    run_gen(cfg, Recorder(cfg, *tiny))
    assert read_manifest(out).window == 2
    ds = load_records(out).with_format("numpy")
    col = np.asarray(ds["window"])
    assert col.shape == (len(ds), 3 * C)
    gold = np.asarray(ds["mode"]) == "gold"
    mismatch = np.asarray(ds["q_argmax"]) != np.asarray(ds["p_argmax"])
    assert (gold & mismatch).sum() >= 3 and (gold & ~mismatch).any()
    assert np.isnan(col[gold & ~mismatch]).all() and np.isfinite(col[gold & mismatch]).all()
    assert np.isfinite(col[~gold][:, :C]).all()  # a rollout token always has its own scalars
    window = window_of_rows(col[gold & mismatch], 2)
    assert window.valid.all() and (window.own("agree") == 0).all()
    with pytest.raises(ValueError, match="window"):
        GenConfig(window=-1)
