"""The llama.cpp backend: GGUF files run by llama.cpp in specroute's loop (router.backends.protocol.Backend).
The models and caches are router/backends/llamacpp.py's; recording's placed tokens fork sequences
(router/backends/llamacpp_branches.py) where torch builds tree-shaped masks."""

from __future__ import annotations

from pathlib import Path

from router.backends.llamacpp import LlamaCppLM, choose_threads, engine_note, engine_setting, feed_tail
from router.backends.llamacpp_branches import LlamaCppRun, chain_scalars, placed_tokens
from router.infra import clock
from router.infra.embedded import cache_root, embedded_gguf
from router.infra.quiet import third_party
from router.loading import Pair, check_same_tokenizer, resolve_model_path, same_files, tiny_pair
from router.machine.hardware import machine_kind


class LlamaCppBackend:
    name = "llamacpp"
    placed_tokens = staticmethod(placed_tokens)
    chain_scalars = staticmethod(chain_scalars)
    continuation_run = LlamaCppRun

    def load_pair(self, drafter: str, verifier: str, dtype, device: str, device_map, threads: int) -> Pair:
        """Both models with the threads chosen once (dtype and device do not apply: the files' own weight types,
        on the CPU; router.pair.check_engine refuses other devices)."""
        threads, why = choose_threads(threads)
        pair = _models(drafter, verifier, threads)
        for model in pair[:2]:
            model.threads_reason = why
        return pair

    def machine(self, model) -> tuple[str, str]:
        return machine_kind("cpu"), f"gguf, {model.threads} threads"  # its speed depends on them

    def setting(self, model) -> str:
        return engine_setting(model)

    def note(self, model) -> dict:
        return engine_note(model)

    def forward_tail(self, model, layout, keep: int, vocab: int, hidden: bool, cache: bool, prefix):
        return feed_tail(model, layout, keep, vocab, hidden, cache, prefix)

    def warm_prefix(self, prefix, model) -> None:
        started = clock.now()
        model.warm_prefix(prefix.ids)  # the prefix's sequence in a context the model keeps between batches
        prefix.seconds += clock.now() - started

    def adopt_identity(self, models, specs: tuple[str, str], manifest) -> bool:
        """Models loaded from the GGUF files a torch recording's models were converted from (same_files) answer to
        the records' fingerprints, so routers trained on those records decode here."""
        recorded_on = manifest.dtype.get("engine", "torch")
        if recorded_on == self.name or not all(same_files(s) for s in specs):
            return False
        for role, model in zip(("drafter", "verifier"), models[:2]):
            model.adopt_fingerprint(manifest.pair[role])
        return True


def _models(drafter: str, verifier: str, threads: int) -> Pair:
    if (drafter, verifier) == ("tiny:drafter", "tiny:verifier"):
        from router.loop.tiny import ByteTokenizer

        paths = tiny_gguf_pair(cache_root() / "gguf")
        return Pair(LlamaCppLM(paths[0], threads), LlamaCppLM(paths[1], threads), ByteTokenizer())
    files = [
        embedded_gguf(spec.split(":", 1)[1]) if spec.startswith("embedded:") else Path(spec)
        for spec in (drafter, verifier)
    ]
    for spec, path in zip((drafter, verifier), files):
        if path.suffix != ".gguf" or not path.is_file():
            raise ValueError(
                f"engine llamacpp loads GGUF files: {spec} is not one (give embedded:drafter, a .gguf path)"
            )
    tokenizers = [_gguf_tokenizer(spec, path) for spec, path in zip((drafter, verifier), files)]
    check_same_tokenizer(*tokenizers)
    if tokenizers[1].pad_token_id is None:
        tokenizers[1].pad_token = tokenizers[1].eos_token
    return Pair(LlamaCppLM(files[0], threads), LlamaCppLM(files[1], threads), tokenizers[1])


def _gguf_tokenizer(spec: str, path: Path):
    """The tokenizer of a GGUF model: the embedded pair's converted folder (no conversion twice), else the file's."""
    from transformers import AutoTokenizer

    if spec.startswith("embedded:"):
        return AutoTokenizer.from_pretrained(resolve_model_path(spec)[0])
    with third_party():
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def tiny_gguf_pair(folder: str | Path, seed: int = 0, noise: float | None = None) -> tuple[Path, Path]:
    """(drafter.gguf, verifier.gguf) of `tiny_pair(seed, noise)` in `folder`, written once per seed and noise
    (router.backends.tiny_gguf: what the llama.cpp engine loads in tests and CI)."""
    from router.backends.tiny_gguf import write_tiny_gguf

    folder = Path(folder)
    tag = f"seed{seed}" if noise is None else f"seed{seed}-noise{noise:g}"
    paths = folder / f"tiny-drafter-{tag}.gguf", folder / f"tiny-verifier-{tag}.gguf"
    if not all(path.exists() for path in paths):
        models = tiny_pair(seed)[:2] if noise is None else tiny_pair(seed, noise)[:2]
        for model, path in zip(models, paths):
            write_tiny_gguf(model, path)
    return paths


LLAMACPP = LlamaCppBackend()
