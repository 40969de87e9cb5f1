"""The tiny random pair as GGUF files llama.cpp loads: tests and CI run the llama.cpp engine without the real pair.

`write_tiny_gguf(model, path)` writes a tiny Qwen2 (router/loop/tiny.py) in llama.cpp's layout: architecture
`qwen2`, every tensor in float32 under llama.cpp's qwen2 names (Qwen2 needs no q/k permutation), and a
`llama` (SentencePiece-style) tokenizer over the byte vocabulary: <pad>, <s>, </s> as CONTROL tokens, then
the 256 bytes as BYTE tokens <0x00>..<0xFF>, so token ids are the ByteTokenizer's. `router.pair.tiny_gguf_pair`
writes the tiny pair's drafter and verifier with it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from router.loop.tiny import BYTE_OFFSET, TINY_VOCAB

# transformers' Qwen2 parameter (inside model.layers.{i}.) -> llama.cpp's tensor (inside blk.{i}.)
LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
MODEL_TENSORS = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                 "lm_head.weight": "output.weight"}  # fmt: skip


def gguf_name(name: str) -> str:
    """llama.cpp's name of a transformers Qwen2 parameter."""
    if name in MODEL_TENSORS:
        return MODEL_TENSORS[name]
    parts = name.split(".")
    rest = ".".join(parts[3:])
    if parts[:2] != ["model", "layers"] or rest not in LAYER_TENSORS:
        raise ValueError(f"{name} has no llama.cpp qwen2 tensor: this writer handles the tiny Qwen2 only")
    return f"blk.{parts[2]}.{LAYER_TENSORS[rest]}"


def write_tiny_gguf(model, path: str | Path) -> Path:
    """Write a tiny Qwen2 causal LM (transformers) as a float32 GGUF llama.cpp loads; returns the path."""
    import gguf

    cfg, path = model.config, Path(path)
    if cfg.vocab_size != TINY_VOCAB:
        raise ValueError(
            f"write_tiny_gguf writes the byte-vocabulary tiny models ({TINY_VOCAB} tokens), got {cfg.vocab_size}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name(getattr(model, "name_or_path", "tiny") or "tiny")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(float(getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_byte_tokenizer(writer, gguf)
    for name, tensor in model.state_dict().items():
        writer.add_tensor(gguf_name(name), tensor.detach().to(torch.float32).contiguous().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_byte_tokenizer(writer, gguf) -> None:
    """A `llama` tokenizer whose ids are the ByteTokenizer's: 3 control tokens, then the 256 byte tokens."""
    tokens = ["<pad>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.CONTROL] * BYTE_OFFSET + [gguf.TokenType.BYTE] * 256
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types([int(t) for t in types])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(False)
