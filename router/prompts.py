"""The prompt text a task example becomes: the task's own context, or a chat-template turn.

One function for data_gen (recording) and eval (online decoding), so a router is evaluated on the
prompts it was trained on; and one rule for prompts longer than the models can read (`fit_prompt`),
used when recording, in online evaluation and by `specroute generate`.
"""

from __future__ import annotations

import warnings


def prompt_text(tokenizer, prompt: str, question: str, chat: bool) -> str:
    """The text fed to the models: `prompt` as given, or (chat) the bare question in the chat template."""
    if not chat:
        return prompt
    return tokenizer.apply_chat_template([{"role": "user", "content": question or prompt}], tokenize=False,
                                         add_generation_prompt=True)


def context_length(*models) -> int:
    """Tokens the models can attend to (the smallest max_position_embeddings; unbounded if unknown)."""
    return min(getattr(m.config, "max_position_embeddings", 1 << 30) or (1 << 30) for m in models)


def prompt_limit(context: int, new_tokens: int, max_prompt_tokens: int | None = None) -> int:
    """Prompt tokens that fit: `max_prompt_tokens` when set, else what leaves room for the new tokens."""
    return max_prompt_tokens or max(1, context - new_tokens - 1)


def fit_prompt(ids: list[int], limit: int) -> tuple[list[int], bool]:
    """The prompt cut from the left to `limit` tokens (its end, where the question is, survives), and
    whether it was cut."""
    return (ids, False) if len(ids) <= limit else (ids[len(ids) - limit:], True)


def warn_truncated(count: int, limit: int, where: str) -> None:
    if count:
        warnings.warn(f"{count} prompt(s) longer than {limit} tokens were truncated from the left for {where} "
                      f"(as recording does)")
