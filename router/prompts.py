"""The prompt text a task example becomes: the task's own context, or a chat-template turn.

One function for data_gen (recording) and eval (online decoding), so a router is evaluated on the
prompts it was trained on.
"""

from __future__ import annotations


def prompt_text(tokenizer, prompt: str, question: str, chat: bool) -> str:
    """The text fed to the models: `prompt` as given, or (chat) the bare question in the chat template."""
    if not chat:
        return prompt
    return tokenizer.apply_chat_template([{"role": "user", "content": question or prompt}], tokenize=False,
                                         add_generation_prompt=True)
