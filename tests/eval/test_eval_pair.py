"""Eval decodes with the records' pair only (eval/models.py)."""

import pytest

from router.records import RecordsError


def test_eval_refuses_another_pair_than_the_records_and_mixed_pairs(tmp_path, tiny, monkeypatch):
    from data_gen.config import GenConfig
    from data_gen.recorder import Recorder
    from data_gen.run import run_gen
    from eval.config import EvalConfig
    from eval.run import run_eval
    from router.pair import tiny_pair

    cfg = GenConfig(
        task="gsm8k",
        drafter="tiny:drafter",
        verifier="tiny:verifier",
        dtype="float32",
        max_examples=6,
        max_continuation_tokens=16,
        output=str(tmp_path / "rec"),
        split_fractions=[0.5, 0.0, 0.5],
    )
    run_gen(cfg, Recorder(cfg, *tiny))
    other = tiny_pair(seed=7)  # the same architecture, other weights
    cfg2 = GenConfig(**{**vars(cfg), "output": str(tmp_path / "rec2")})
    run_gen(cfg2, Recorder(cfg2, *other))
    base = dict(online=True, max_prompts=1, max_new_tokens=4, online_methods=["lossless"], cost_ratio=0.3)
    with pytest.raises(RecordsError, match="come from different model pairs"):
        run_eval(EvalConfig(records=[cfg.output, cfg2.output], output=str(tmp_path / "e1"), **base))
    # models that are not the records' pair (as a drafter=/verifier= override loads): refused
    import router.backends.torch_models as tiny_module  # where load_pair builds the tiny pair

    monkeypatch.setattr(tiny_module, "tiny_pair", lambda *a, **k: other)
    with pytest.raises(ValueError, match=r"the loaded drafter and verifier differ from the ones the records"):
        run_eval(EvalConfig(records=[cfg.output], output=str(tmp_path / "e2"), offline=False, **base))
