"""Recordings that cannot be made are refused, naming the file or setting (data_gen)."""

import json

import pytest

from router.records import RecordsError


@pytest.mark.parametrize("content,message", [("", "is empty"), ("this is { not json\n", "cannot read")])
def test_bad_custom_data_files_are_named(tmp_path, content, message):
    from data_gen.tasks import load_user_data

    data = tmp_path / "mine.jsonl"
    data.write_text(content)
    with pytest.raises(ValueError, match=message):
        list(load_user_data(str(data), "prompt", "reference"))


def test_a_broken_gen_config_in_an_unfinished_folder_is_named(tmp_path):
    from data_gen.config import GenConfig
    from data_gen.run import run_gen
    from router.infra.config import ConfigError

    out = tmp_path / "r"
    out.mkdir()
    (out / "gen_config.json").write_text("{ broken")
    with pytest.raises(ConfigError, match="gen_config.json is not valid JSON"):
        run_gen(GenConfig(drafter="tiny:drafter", verifier="tiny:verifier", dtype="float32", output=str(out)))


def test_a_recording_of_blank_prompts_is_refused_not_finished(tmp_path):
    from data_gen.config import GenConfig
    from data_gen.run import run_gen

    data = tmp_path / "blank.jsonl"
    data.write_text("".join(json.dumps({"prompt": "  ", "reference": "x"}) + "\n" for _ in range(4)))
    cfg = GenConfig(
        task="custom",
        data_path=str(data),
        drafter="tiny:drafter",
        verifier="tiny:verifier",
        dtype="float32",
        output=str(tmp_path / "rec"),
    )
    with pytest.raises(RecordsError, match="every prompt of task custom is blank"):
        run_gen(cfg)
    assert not (tmp_path / "rec" / "manifest.json").exists()
