"""Tiny random models + byte tokenizer, built from configs: no downloads, seconds to run.

Used by the `tiny` configs, the tests and the benchmarks' fallback. The verifier is a small random
Qwen2; the drafter is a copy with slightly perturbed weights, so the two agree often but not
always, like a real pair: `router.pair.tiny_pair` makes that pair, beside the loader of every other
pair, and the model specs `tiny:drafter` / `tiny:verifier` load it.
"""

from __future__ import annotations

import torch

BYTE_OFFSET = 3  # ids 0, 1, 2 are <pad>, <s>, </s>; byte b is id b + 3
TINY_VOCAB = 256 + BYTE_OFFSET


class ByteTokenizer:
    """UTF-8 bytes as tokens: the smallest tokenizer that round-trips any text."""

    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2
    pad_token, bos_token, eos_token = "<pad>", "<s>", "</s>"
    chat_template = "byte-chat"
    name_or_path = "specroute/byte-tokenizer"

    def __len__(self) -> int:
        return TINY_VOCAB

    def get_vocab(self) -> dict[str, int]:
        specials = {self.pad_token: 0, self.bos_token: 1, self.eos_token: 2}
        return {**specials, **{f"<0x{b:02X}>": b + BYTE_OFFSET for b in range(256)}}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [b + BYTE_OFFSET for b in text.encode("utf-8")]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = ids.tolist() if torch.is_tensor(ids) else list(ids)
        data = bytes(i - BYTE_OFFSET for i in ids if i >= BYTE_OFFSET)
        return data.decode("utf-8", errors="replace")

    def __call__(self, text, return_tensors=None, **_):
        ids = self.encode(text)
        if return_tensors == "pt":
            ids_t = torch.tensor([ids], dtype=torch.long)
            return type("Enc", (), {"input_ids": ids_t, "attention_mask": torch.ones_like(ids_t)})()
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **_):
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        text += "<assistant>" if add_generation_prompt else ""
        return self.encode(text) if tokenize else text


def tiny_model(seed: int = 0, layers: int = 2, hidden: int = 64, vocab: int = TINY_VOCAB):
    """A random Qwen2 causal LM (by default over the byte vocabulary), float32, eval mode."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        eos_token_id=2,
        bos_token_id=1,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    torch.random.set_rng_state(gen_state)
    with torch.no_grad():  # sharper next-token distributions than the default init
        model.lm_head.weight.mul_(25.0)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = 2, 0
    model.name_or_path = f"tiny:seed{seed}"
    return model


def byte_tokenizer_fast():
    """The ByteTokenizer's ids as a Hugging Face fast tokenizer (what a model folder needs for other engines, e.g.
    vLLM): byte b is token b + 3 after <pad>, <s>, </s>; no merges, so encode(text) is its UTF-8 bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    to_char = bytes_to_unicode()  # byte -> the printable character byte-level BPE spells it with
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{to_char[b]: b + BYTE_OFFSET for b in range(256)}}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>", clean_up_tokenization_spaces=False
    )
    fast.chat_template = CHAT_TEMPLATE  # the ByteTokenizer's chat format, for servers' chat endpoints
    return fast


CHAT_TEMPLATE = (  # ByteTokenizer.apply_chat_template as Jinja: "<role>content\n" per message, then "<assistant>"
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def save_tiny_pair(folder, seed: int = 0, hidden: int = 64, noise: float = 0.002) -> tuple:
    """The tiny pair (as router.pair.tiny_pair makes it, at this width) saved as two Hugging Face folders with a
    real tokenizer, `folder`/drafter and `folder`/verifier, float32; returns their paths. Other engines load
    them as they load any model (vLLM's CPU attention wants heads of 32 or more dimensions: hidden >= 128)."""
    import copy
    from pathlib import Path

    verifier = tiny_model(seed, hidden=hidden)
    drafter = copy.deepcopy(verifier)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for w in drafter.parameters():
            w.add_(torch.randn(w.shape, generator=gen) * noise)
    tokenizer = byte_tokenizer_fast()
    paths = []
    for name, model in (("drafter", drafter), ("verifier", verifier)):
        path = Path(folder) / name
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths.append(path)
    return tuple(paths)
