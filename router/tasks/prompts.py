"""The prompt text a task example becomes: the task's own context, or a chat-template turn.

One function for data_gen (recording) and eval (online decoding), so a router is evaluated on the
prompts it was trained on; and one rule for prompts longer than the models can read (`fit_prompt`),
used when recording, in online evaluation and by `specroute generate`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass


def prompt_text(tokenizer, prompt: str, question: str, chat: bool) -> str:
    """The text fed to the models: `prompt` as given, or (chat) the bare question in the chat template."""
    if not chat:
        return prompt
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": question or prompt}], tokenize=False, add_generation_prompt=True
    )


def context_length(*models) -> int:
    """Tokens the models can attend to (the smallest max_position_embeddings; unbounded if unknown)."""
    return min(getattr(m.config, "max_position_embeddings", 1 << 30) or (1 << 30) for m in models)


def prompt_limit(context: int, new_tokens: int, max_prompt_tokens: int | None = None) -> int:
    """Prompt tokens that fit: `max_prompt_tokens` when set, else what leaves room for the new tokens."""
    return max_prompt_tokens or max(1, context - new_tokens - 1)


def fit_prompt(ids: list[int], limit: int) -> tuple[list[int], bool]:
    """The prompt cut from the left to `limit` tokens (its end, where the question is, survives), and
    whether it was cut."""
    return (ids, False) if len(ids) <= limit else (ids[len(ids) - limit :], True)


def warn_truncated(count: int, limit: int, where: str) -> None:
    if count:
        warnings.warn(
            f"{count} prompt(s) longer than {limit} tokens were truncated from the left for {where} (as recording does)"
        )


# Few-shot contexts separate their shots by a blank line (GSM8K) or one line per answer (the QA
# tasks): a model continuing such a prompt goes on to write the next shot, so the row ends there.
FEW_SHOT_STOPS = {"gsm8k": ["\n\n", "\nQuestion:"], "triviaqa": ["\n"], "nq": ["\n"], "squad": ["\n"]}
# Chat turns end at EOS; for code tasks the metric reads the first fenced block only, so the row
# ends at its closing fence (a fence line followed by more text) instead of explaining the code.
CHAT_STOPS = {"mbpp": ["\n```\n"], "humaneval": ["\n```\n"]}


def default_stops(task: str, chat: bool) -> list[str]:
    """Stop strings of a task's prompt format (none for unknown tasks)."""
    return list((CHAT_STOPS if chat else FEW_SHOT_STOPS).get(task, []))


_TOKEN_TEXTS: dict = {}


@dataclass(frozen=True, eq=False)
class StopStrings:
    """Strings that end a generated row wherever they appear in its text (e.g. a blank line, or
    '\nQuestion:' when a few-shot model starts the next shot), checked on the text of the row's
    last tokens as they are emitted, so a string split over several tokens is caught too. The
    token that completes a string is kept; `cut_at_stop` removes the string from the text."""

    strings: tuple
    token_text: tuple  # the text of every token id
    window: int = 0  # characters of a row's tail to keep: enough for the longest string to straddle tokens

    @classmethod
    def build(cls, tokenizer, strings: list[str]) -> "StopStrings | None":
        """None when there are no strings; each token's text is decoded once per tokenizer."""
        if not strings:
            return None
        if any(not isinstance(s, str) or not s for s in strings):
            raise ValueError(f"stop strings must be non-empty strings, got {strings!r}")
        key = (getattr(tokenizer, "name_or_path", None) or id(tokenizer), len(tokenizer))
        if key not in _TOKEN_TEXTS:
            ids = [[i] for i in range(len(tokenizer))]
            _TOKEN_TEXTS[key] = tuple(
                tokenizer.batch_decode(ids)
                if hasattr(tokenizer, "batch_decode")
                else [tokenizer.decode(i) for i in ids]
            )
        return cls(tuple(strings), _TOKEN_TEXTS[key], 2 * max(len(s) for s in strings) + 16)

    def text(self, token: int) -> str:
        return self.token_text[token] if 0 <= token < len(self.token_text) else ""

    def found(self, tail: str) -> bool:
        return any(s in tail for s in self.strings)

    def ends(self, row: int, tokens: list[int]) -> bool:
        """Whether row `row` ends after its emitted `tokens` for a reason of its own (none here; the
        consequence search's RejoinStop ends a branch that has re-joined the answer it left)."""
        return False


def cut_at_stop(text: str, stops: list[str]) -> str:
    """The text before the first stop string."""
    for s in stops:
        text = text.split(s, 1)[0]
    return text
