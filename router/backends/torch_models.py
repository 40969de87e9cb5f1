"""The torch backend: transformers models in specroute's loop (router.backends.protocol.Backend)."""

from __future__ import annotations

from router.loading import Pair, check_device, check_same_tokenizer, load_model, resolve_model_path, tiny_pair
from router.loop.layout import Layout, cache_argument, returned_cache
from router.machine.hardware import machine_kind, resolve_dtype


class TorchBackend:
    name = "torch"
    placed_tokens = chain_scalars = continuation_run = None  # tree-shaped attention masks (data_gen)

    def load_pair(self, drafter: str, verifier: str, dtype, device: str, device_map, threads: int) -> Pair:
        if drafter.startswith("tiny:") or verifier.startswith("tiny:"):
            return _tiny(drafter, verifier, dtype, device, device_map)
        for spec in (drafter, verifier):  # a missing folder is said before either model loads
            resolve_model_path(spec)
        d_model, d_tok = load_model(drafter, dtype, device)
        v_model, v_tok = load_model(verifier, dtype, device, device_map=device_map)
        check_same_tokenizer(d_tok, v_tok)
        if v_tok.pad_token_id is None:
            v_tok.pad_token = v_tok.eos_token
        return Pair(d_model, v_model, v_tok)

    def machine(self, model) -> tuple[str, str]:
        param = next(model.parameters())
        return machine_kind(str(param.device)), str(param.dtype).removeprefix("torch.")

    def setting(self, model) -> str:
        return str(getattr(model, "dtype", None) or next(model.parameters()).dtype)

    def note(self, model) -> None:
        return None  # torch's runs are described by their dtype choice

    def forward_tail(self, model, layout: Layout, keep: int, vocab: int, hidden: bool, cache: bool, prefix):
        start = len(prefix) if prefix is not None else 0
        past = {cache_argument(model): prefix.cache_for(model, layout.tokens.shape[0])} if prefix is not None else {}
        out = model(
            input_ids=layout.tokens[:, start:],
            attention_mask=layout.mask,
            position_ids=layout.pos[:, start:],
            use_cache=cache or prefix is not None,
            logits_to_keep=keep,
            output_hidden_states=hidden,
            **past,
        )
        states = out.hidden_states[-1][:, -keep:] if hidden else None  # (B, keep, H)
        kv = returned_cache(out) if cache else None
        return out.logits[:, -keep:, :vocab], states, kv

    def warm_prefix(self, prefix, model) -> None:
        prefix.cache_for(model, 1)  # the prefix's KV cache, kept and copied for each batch

    def adopt_identity(self, models, specs: tuple[str, str], manifest) -> bool:
        return False  # a torch model's fingerprint is its weights'


def _tiny(drafter: str, verifier: str, dtype, device: str, device_map) -> Pair:
    """router.loading.tiny_pair on `device` in the resolved dtype (tests, CI, the demo's tiny preset)."""
    if (drafter, verifier) != ("tiny:drafter", "tiny:verifier"):
        raise ValueError("the tiny pair is `tiny:drafter` with `tiny:verifier`; it cannot be mixed with other models")
    if device_map is not None:
        raise ValueError(
            "verifier_device_map needs a saved model (a hub id or a folder): the tiny pair is built in memory"
        )
    check_device(device)
    choice = resolve_dtype(dtype, device)
    d_model, v_model, tok = tiny_pair()
    return Pair(d_model.to(device, choice.dtype), v_model.to(device, choice.dtype), tok)


TORCH = TorchBackend()
