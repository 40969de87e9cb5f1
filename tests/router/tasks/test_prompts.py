"""Online prompts are cut as recording cuts them (router/tasks/prompts.py)."""

import pytest


def test_online_prompts_are_cut_as_recording_cuts_them():
    from eval.online import prepare_prompts
    from router.tasks.prompts import fit_prompt, prompt_limit

    assert fit_prompt([1, 2, 3, 4], 2) == ([3, 4], True) and fit_prompt([1, 2], 5) == ([1, 2], False)
    assert prompt_limit(32768, 128) == 32639 and prompt_limit(32768, 128, max_prompt_tokens=256) == 256

    class Tok:
        def encode(self, text, add_special_tokens=False):
            return list(range(len(text)))

    examples = [{"example_id": "a", "prompt": "x" * 6000}, {"example_id": "b", "prompt": "short"}]
    with pytest.warns(UserWarning, match="1 prompt.*truncated from the left"):
        prompts = prepare_prompts(Tok(), examples, chat=False, max_prompts=2, limit=100)
    assert [len(p.ids) for p in prompts] == [100, 5] and prompts[0].ids[-1] == 5999  # the end survives
