"""Judge inputs: the verifier's view of drafted tokens, recorded with one tree-masked forward."""

import numpy as np
import pytest
import torch

from data_gen.judge import judge_inputs
from helpers import custom_gen_config
from data_gen.recorder import Recorder
from data_gen.run import run_gen
from router.loop.layout import cache_argument
from router.loop.teacher import forward_tail
from router.features import TOKEN_CLASS_NAMES, class_bits, lookahead_features
from router.loop.layout import Layout, left_pad
from router.records import Manifest, RecordsError, load_records, read_manifest, read_token_classes, require_judge
from router.loop.tiny import ByteTokenizer


def direct_view(verifier, prefix: list[int], token: int, vocab: int):
    """The verifier's last hidden state and lookahead after reading prefix + [token], one plain forward."""
    out = verifier(input_ids=torch.tensor([prefix + [token]]), output_hidden_states=True)
    return out.hidden_states[-1][0, -1], lookahead_features(out.logits[0, -1, :vocab].softmax(-1))


@pytest.mark.parametrize("max_tree", [512, 3])
def test_tree_pass_matches_one_forward_per_position(monkeypatch, max_tree, tiny):
    """Every substituted token sees its own gold prefix (ragged, left-padded rows; chunked passes too)."""
    import data_gen.judge as judge

    monkeypatch.setattr(judge, "MAX_TREE", max_tree)
    drafter, verifier, tok = tiny
    vocab = 259
    prompts = [tok.encode("Q: 2+3?\nA:"), tok.encode("Hi")]
    conts = [tok.encode(" 5 because"), tok.encode(" there, you")]
    rng = np.random.default_rng(0)
    drafted = {
        "argmax": [np.where(rng.random(len(c)) < 0.5, rng.integers(3, vocab, len(c)), c) for c in conts],
        "sample": [rng.integers(3, vocab, len(c)) for c in conts],
    }
    ids, mask = left_pad([p + c for p, c in zip(prompts, conts)], 0)
    layout = Layout(ids, mask)
    keep = max(len(c) for c in conts) + 1
    with torch.inference_mode():
        p_logits, p_hidden, cache = forward_tail(verifier, layout, keep, vocab, True, cache=True)
        rows = judge_inputs(
            verifier, cache, cache_argument(verifier), layout, p_logits, p_hidden, conts, drafted, vocab
        )
        for b, (prompt, cont) in enumerate(zip(prompts, conts)):
            for name, prefix_col in (("argmax", "after_"), ("sample", "sample_after_")):
                for t in range(len(cont)):
                    h, look = direct_view(verifier, prompt + cont[:t], int(drafted[name][b][t]), vocab)
                    np.testing.assert_allclose(rows[b][f"{prefix_col}hidden"][t], h.numpy(), atol=2e-2)
                    np.testing.assert_allclose(rows[b][f"{prefix_col}lookahead"][t], look.numpy(), atol=1e-4)


def test_recorded_judge_columns_and_token_classes(tmp_path, tiny):
    out = tmp_path / "r"
    cfg = custom_gen_config(
        _qa(tmp_path),
        out,
        batch_size=3,
        examples_per_shard=4,
        modes=["gold", "rollout"],
        rollout_max_new_tokens=8,
        judge=True,
    )
    run_gen(cfg, Recorder(cfg, *tiny))
    manifest = read_manifest(out)
    require_judge(out, manifest)
    ds = load_records(out).with_format("numpy")
    hidden = np.asarray(ds["after_hidden"])
    assert hidden.shape == (len(ds), tiny[1].config.hidden_size) and np.isfinite(hidden).all()
    assert np.asarray(ds["after_lookahead"]).shape == (len(ds), 2)
    q_draft = np.asarray(ds["q_draft"])
    assert ((q_draft > 0) & (q_draft <= 1)).all()
    # where the drafter's argmax is the trajectory's token, its view is the teacher-forced column's
    same = np.asarray(ds["q_argmax"]) == np.asarray(ds["token"])
    assert same.any() and (~same).any()
    table = read_token_classes(out, manifest)
    assert table.shape == (manifest.vocab,)
    bits = class_bits(torch.from_numpy(table), torch.tensor(ByteTokenizer().encode(" 7,\n")))
    names = [[TOKEN_CLASS_NAMES[i] for i in np.nonzero(row)[0]] for row in bits.numpy()]
    assert names == [["punctuation", "leading_space"], ["digit"], ["punctuation"], ["newline"]]


def test_folder_without_judge_inputs_is_refused(tmp_path):
    with pytest.raises(RecordsError, match="judge=true"):
        require_judge(tmp_path, Manifest(task="t", shards=[], feature_names=[], judge=False))


def _qa(tmp_path):
    import json

    path = tmp_path / "qa.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {"id": f"q{i}", "question": f"What is {i} + {i}?\nA:", "answer": f" {2 * i}, since {i}+{i}={2 * i}."}
            )
            + "\n"
            for i in range(10)
        )
    )
    return path
