"""llama.cpp as a second engine for the decoding loop: a GGUF model run by llama-cpp-python's low-level API.

`LlamaCppLM(path)` loads a GGUF file; pass it to `router.decoding.generate` (or the baselines) as the drafter
and/or the verifier, as a transformers model is passed. The loop drives every model through the same cache
interface (`router.loop.layout.CachedModel`: feed the new columns of the batch's layout, get logits at the
last `keep`, roll back, drop rows); `LlamaCppCache` is that interface on llama.cpp. Each row of the batch is
one llama.cpp sequence of one context, so a batch is one `llama_decode` call with logits at every position
asked for; a rolled-back draft is removed from its sequence (`llama_memory_seq_rm`) before the next feed,
which is where llama.cpp differs from torch's masked holes: its sequences have no holes, their positions
stay contiguous. Hidden states (for routers that read them) are llama.cpp's embeddings with no pooling,
the final normed layer, as transformers' last hidden state. A shared prompt prefix is decoded once into a
sequence of its own and copied into each row (`start_from`); contexts are kept between batches, prefix and all
(router/backends/llamacpp_lib.py). Recording places tokens where a row has others through forked sequences
(`LlamaCppCache.fork`/`extend`/`drop`; router/backends/llamacpp_branches.py).

llama-cpp-python is optional (`bash scripts/setup.sh llamacpp` builds it, about 12 CPU-minutes); threads are
printed beside every figure measured with it (`threads`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from router.backends.llamacpp_lib import (
    kernels,
    LLAMA_CPP_PYTHON,
    MAX_SEQUENCES,
    PREFIX_SEQ,
    ROW_ROOM,
    Context,
    choose_threads,
    llama_cpp,
)
from router.infra import clock
from router.machine.hardware import cpu_kind

__all__ = [
    "LLAMA_CPP_PYTHON",
    "LlamaCppCache",
    "LlamaCppLM",
    "choose_threads",
    "engine_note",
    "is_llamacpp",
    "llama_cpp",
]
FREE_CONTEXTS = 2  # contexts a model keeps for its next batches (each holds its KV buffer and prefix)


def engine_note(model: "LlamaCppLM") -> dict:
    """What a manifest or report says of a run on llama.cpp, in the place of torch's dtype note: the GGUF
    files' own weight types, the CPU, the threads and why."""
    return {
        "dtype": "gguf",
        "reason": "engine llamacpp: the pair's GGUF files (their own weight types) run by llama.cpp",
        "kernels": kernels(),
        "cpu": cpu_kind().rsplit(",", 1)[0],  # without torch's thread count: llama.cpp's is beside it
        "engine": "llamacpp",
        "threads": model.threads,
        "threads_reason": model.threads_reason,
        "setting": f"llama.cpp ({kernels()} kernels) with {model.threads} threads ({model.threads_reason})",
    }


def engine_setting(model: "LlamaCppLM") -> str:
    """What a llama.cpp model runs on, as summaries and headers print it: the build's kernels and the threads."""
    return f"llama.cpp GGUF ({kernels()} kernels), {model.threads} threads"


def is_llamacpp(obj) -> bool:
    """True for a model or cache of this engine (the places that build torch-only masks branch on it)."""
    return getattr(obj, "engine", "torch") == "llamacpp"


class LlamaCppLM:
    """A GGUF causal LM run by llama.cpp, with the attributes the decoding loop reads of a model
    (`config`, `generation_config`, `name_or_path`, `vocab_size`)."""

    engine = "llamacpp"

    def __init__(self, path: str | Path, n_threads: int | None = None, context: int = 8192):
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path} is not a GGUF file: give the path of a .gguf model")
        lib = self._lib = llama_cpp()  # kept: freeing at interpreter exit must not import again
        self.path, self.context = path, context  # context: tokens of a batch's rows together (prompts + new)
        self.threads, self.threads_reason = choose_threads(n_threads or 0)  # printed beside every figure
        self.model = lib.llama_model_load_from_file(str(path).encode(), lib.llama_model_default_params())
        if not self.model:
            raise ValueError(f"llama.cpp could not load {path}: is it a GGUF model file llama.cpp supports?")
        vocab = lib.llama_model_get_vocab(self.model)
        self.vocab_size = int(lib.llama_vocab_n_tokens(vocab))
        self.hidden_size = int(lib.llama_model_n_embd(self.model))
        # every token llama.cpp ends a generation at (its own tools stop there): the EOS id alone misses
        # <|endoftext|>, which the Qwen pair writes after a few-shot answer (0.05 s for 152k tokens)
        eos = [i for i in range(self.vocab_size) if lib.llama_vocab_is_eog(vocab, i)]
        pad = int(lib.llama_vocab_pad(vocab))
        trained_context = int(lib.llama_model_n_ctx_train(self.model))
        self.config = SimpleNamespace(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, eos_token_id=eos,
            max_position_embeddings=trained_context,
        )  # fmt: skip
        self.generation_config = SimpleNamespace(eos_token_id=eos, pad_token_id=pad if pad >= 0 else None)
        self.name_or_path = str(path)
        self._free: list[Context] = []  # contexts kept between batches (lease, release)

    def fingerprint(self) -> str:
        """The GGUF file's identity: "gguf-" + the first 16 hex digits of its sha256 (hashed once)."""
        if getattr(self, "_fingerprint", None) is None:
            from router.infra.files import file_sha256

            self._fingerprint = "gguf-" + file_sha256(self.path)[:16]
        return self._fingerprint

    def adopt_fingerprint(self, fingerprint: str) -> None:
        """Answer to `fingerprint` from now on: for a GGUF file that another engine's model was converted from
        (router.pair.same_files), whose records and routers name that model's fingerprint."""
        self._fingerprint = fingerprint

    def kv_cache(self, vocab: int) -> "LlamaCppCache":
        """The loop's cache over this model (router.loop.layout.model_cache calls it)."""
        return LlamaCppCache(self, vocab)

    def lease(self, tokens: int) -> Context:
        """A context with room for `tokens` cells (at least `context`): a free one kept from an earlier batch
        (its prefix sequence still there), else a new one. Give it back with `release`."""
        for c in self._free:
            if c.n_ctx >= tokens:
                self._free.remove(c)
                return c
        size = max(self.context, -(-tokens // 256) * 256)
        try:
            return Context(self._lib, self.model, size, self.threads)
        except MemoryError:
            raise MemoryError(
                f"llama.cpp could not make a context of {size} tokens for {self.path.name}: use smaller batches"
            ) from None

    def warm_prefix(self, ids: list[int]) -> None:
        """Decode a shared prompt prefix into a kept context's prefix sequence now (router.loop.prefix.
        SharedPrefix.ready), so the first batch that starts from it does not pay for it."""
        context = self.lease(len(ids) + ROW_ROOM)
        try:
            hold_prefix(context, tuple(ids), self.vocab_size)
        finally:
            self.release(context)

    def release(self, context: Context) -> None:
        """Keep a context for the next batch (every sequence but the prefix's dropped); the oldest beyond
        FREE_CONTEXTS is freed."""
        context.keep_prefix_only()
        self._free.insert(0, context)
        for old in self._free[FREE_CONTEXTS:]:
            old.free()
        del self._free[FREE_CONTEXTS:]

    def __del__(self):
        if getattr(self, "model", None):
            with contextlib.suppress(TypeError, AttributeError):  # at interpreter exit the bindings may be gone
                for c in self._free:
                    c.free()
                self._lib.llama_model_free(self.model)
            self.model = None


def feed_tail(model: "LlamaCppLM", layout, keep: int, vocab: int, hidden: bool, cache: bool, prefix):
    """router.loop.teacher.forward_tail on llama.cpp: the model's LlamaCppCache is the returned cache."""
    run = model.kv_cache(vocab)
    run.want_hidden = hidden
    if prefix is not None:
        run.start_from(prefix, layout.tokens.shape[0])
    logits = run.feed(layout, layout.length, keep)  # (B, keep, V)
    states = run.last_hidden if hidden else None
    if not cache:
        run.close()  # the context goes back to the model, its prefix kept for the next batch
    return logits, states, run if cache else None


def hold_prefix(context: Context, ids: tuple[int, ...], vocab: int) -> None:
    """Make the context's prefix sequence hold `ids` (decoded unless it holds them already)."""
    if context.prefix != ids:
        context.remove(PREFIX_SEQ)
        context.decode([(PREFIX_SEQ, i, t, False) for i, t in enumerate(ids)], vocab, False)
        context.prefix = ids


class LlamaCppCache:
    """`router.loop.layout.CachedModel`'s interface on llama.cpp: row b of the layout is sequence `rows[b]`,
    holding the row's first `kv_len[b]` real tokens at positions 0..kv_len[b] - 1. Branches forked from a row
    (`fork`, `extend`, `drop`) are further sequences sharing its first cells: how recording places a token or a
    short continuation where the row has another (judge inputs, window chains, short-horizon labels), as torch
    does with a tree-shaped attention mask."""

    engine = "llamacpp"

    def __init__(self, model: LlamaCppLM, vocab: int):
        self.model, self.vocab = model, vocab  # `model` as CachedModel.model
        self.context: Context | None = None  # leased from the model on the first feed, given back by close()
        self.rows: list[int] = []  # the sequence of each layout row
        self.kv_len: list[int] = []
        self.n_cached = 0  # columns of the layout fed
        self.prefix = None  # the SharedPrefix the rows start from (start_from), copied in at the first feed
        self.branches: dict[int, int] = {}  # forked sequence -> its length
        self.forwards, self.row_forwards, self.seconds = 0, 0, 0.0
        self.want_hidden = False
        self.last_hidden = None  # (B, keep, H) of the latest feed when want_hidden

    def start_from(self, prefix, batch: int) -> None:
        """The layout's first len(prefix) columns are a shared prompt prefix: the rows copy the context's prefix
        sequence (decoded once per model and kept between batches) instead of decoding those columns."""
        self.prefix, self.n_cached = prefix, len(prefix)

    def feed(self, layout, upto: int, keep: int) -> torch.Tensor:
        """Decode the columns [n_cached, upto) of every row (its real tokens) in one llama_decode and
        return logits (B, keep, V) at the last `keep` columns (zeros where a row has no token)."""
        started = clock.now()
        if self.context is None:
            self._open(layout, upto)
        self._forget_rolled_back(layout)
        entries, rows, cols = self._entries(layout, upto, keep)
        logits, hidden = self.context.decode(entries, self.vocab, self.want_hidden)  # (n_out, V), (n_out, H)
        batch = layout.tokens.shape[0]
        out = np.zeros((batch, keep, self.vocab), dtype=np.float32)  # (B, keep, V)
        out[rows, cols] = logits
        if hidden is not None:
            self.last_hidden = torch.zeros((batch, keep, hidden.shape[-1]))  # (B, keep, H)
            self.last_hidden[rows, cols] = torch.from_numpy(hidden)
        self.n_cached = upto
        self.forwards += 1
        self.row_forwards += batch
        self.seconds += clock.now() - started
        return torch.from_numpy(out)

    def _open(self, layout, upto: int) -> None:
        """Lease a context sized for this batch and put the shared prefix in every row."""
        batch = layout.tokens.shape[0]
        if batch >= PREFIX_SEQ:
            raise ValueError(
                f"llama.cpp decodes at most {PREFIX_SEQ} rows in one context, the batch has {batch}: "
                f"split it into batches of at most {PREFIX_SEQ}"
            )
        fed = int(layout.mask[:, self.n_cached : upto].sum())
        self.context = self.model.lease(fed + batch * ROW_ROOM + (len(self.prefix) if self.prefix else 0))
        self.rows, self.kv_len = list(range(batch)), [0] * batch
        if self.prefix is not None:
            ids = tuple(self.prefix.ids)
            hold_prefix(self.context, ids, self.vocab)
            for seq in self.rows:
                self.context.copy(PREFIX_SEQ, seq, len(ids))
            self.kv_len = [len(ids)] * batch

    def _forget_rolled_back(self, layout) -> None:
        """Remove from each sequence the tokens the loop turned into holes since the last feed (a rejected
        suffix of the row's real tokens): llama.cpp's sequences have no holes, their positions stay contiguous."""
        kept = layout.mask[:, : self.n_cached].sum(-1).tolist()  # (B,) real tokens fed
        for i, seq in enumerate(self.rows):
            if self.kv_len[i] > kept[i]:
                self.context.remove(seq, kept[i])
                self.kv_len[i] = kept[i]

    def _entries(self, layout, upto: int, keep: int):
        """The decode's entries (sequence, position, token, wants output) and, per output, its row and column."""
        width = upto - self.n_cached
        tokens = layout.tokens[:, self.n_cached : upto].tolist()
        real = layout.mask[:, self.n_cached : upto].tolist()
        entries, rows, cols = [], [], []
        for i, seq in enumerate(self.rows):
            position = self.kv_len[i]
            for j in range(width):
                if real[i][j]:
                    out = j >= width - keep
                    entries.append((seq, position, tokens[i][j], out))
                    if out:
                        rows.append(i)
                        cols.append(j - (width - keep))
                    position += 1
            self.kv_len[i] = position
        return entries, rows, cols

    # ---- branches: tokens placed after a row's first cells, each branch seeing only those and itself ----------
    def free_sequences(self) -> int:
        """How many branches may be forked now (llama.cpp has MAX_SEQUENCES sequences per context)."""
        return PREFIX_SEQ - len(self.rows) - len(self.branches)

    def fork(self, row: int, at: int) -> int:
        """A new sequence holding layout row `row`'s tokens at positions [0, at) (the same cells, no decode)."""
        used = set(self.rows) | set(self.branches)
        seq = next((s for s in range(PREFIX_SEQ) if s not in used), None)
        if seq is None:
            raise RuntimeError(f"no free llama.cpp sequence: at most {MAX_SEQUENCES} per context; drop branches first")
        self.context.copy(self.rows[row], seq, at)
        self.branches[seq] = at
        return seq

    def extend(self, tokens: list[tuple[int, list[int]]], hidden: bool = False):
        """Decode tokens onto forked sequences, [(sequence, tokens)], all in one llama_decode. Returns per branch
        its logits (n, V) at every new token and, with `hidden`, its final hidden states (n, H), else None."""
        started = clock.now()
        entries = [(seq, self.branches[seq] + k, t, True) for seq, toks in tokens for k, t in enumerate(toks)]
        logits, states = self.context.decode(entries, self.vocab, hidden)
        for seq, toks in tokens:
            self.branches[seq] += len(toks)
        sizes = np.cumsum([len(toks) for _, toks in tokens])[:-1]
        self.forwards += 1
        self.seconds += clock.now() - started
        logits = [torch.from_numpy(x) for x in np.split(logits, sizes)]
        return logits, [torch.from_numpy(x) for x in np.split(states, sizes)] if hidden else None

    def drop(self, seqs) -> None:
        """Forget forked sequences."""
        for seq in list(seqs):
            self.context.remove(seq)
            del self.branches[seq]

    # ---- the loop's rollback and finished rows --------------------------------------------------------------
    def crop_to(self, length: int) -> None:
        """Columns past `length` are holes in every row: the next feed removes them from the sequences."""
        self.n_cached = min(self.n_cached, length)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only these rows (finished ones leave the batch): their sequences stay, the others are freed."""
        keep = rows.tolist()
        if self.context is not None:
            for i in set(range(len(self.rows))) - set(keep):
                self.context.remove(self.rows[i])
        self.rows = [self.rows[i] for i in keep]
        self.kv_len = [self.kv_len[i] for i in keep]

    def close(self) -> None:
        """Give the context back to the model for its next batch (its prefix sequence kept)."""
        if self.context is not None:
            self.model.release(self.context)
            self.context = None

    def __del__(self):
        with contextlib.suppress(TypeError, AttributeError):  # at interpreter exit the bindings may be gone
            self.close()
