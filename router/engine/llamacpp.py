"""llama.cpp as a second engine for the decoding loop: a GGUF model run by llama-cpp-python's low-level API.

`LlamaCppLM(path)` loads a GGUF file; pass it to `router.decoding.generate` (or the baselines) as the drafter
and/or the verifier, as a transformers model is passed. The loop drives every model through the same cache
interface (`router.engine.layout.CachedModel`: feed the new columns of the batch's layout, get logits at the
last `keep`, roll back, drop rows); `LlamaCppCache` is that interface on llama.cpp. Each row of the batch is
one llama.cpp sequence of one context, so a batch is one `llama_decode` call with logits at every position
asked for; a rolled-back draft is removed from its sequence (`llama_memory_seq_rm`) before the next feed,
which is where llama.cpp differs from torch's masked holes: its sequences have no holes, their positions
stay contiguous. Hidden states (for routers that read them) are llama.cpp's embeddings with no pooling,
the final normed layer, as transformers' last hidden state.

llama-cpp-python is optional (`bash scripts/setup.sh llamacpp` builds it, about 12 CPU-minutes); threads are
printed beside every figure measured with it (`threads`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from router.infra import clock

LLAMA_CPP_PYTHON = "0.3.36"  # the pinned llama-cpp-python (scripts/setup.sh)
MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ: rows of one batch
_LOG_SINK = []  # the silent log callback, kept alive for as long as llama.cpp may call it


def llama_cpp():
    """The llama_cpp module, or an ImportError saying how to install it."""
    try:
        import llama_cpp as lib
    except ImportError:
        raise ImportError(
            f"the llama.cpp engine needs llama-cpp-python=={LLAMA_CPP_PYTHON}: run `bash scripts/setup.sh llamacpp` "
            f"(it builds llama.cpp from source, about 12 CPU-minutes)"
        ) from None
    if not _LOG_SINK:  # llama.cpp logs every load and context to stderr: keep the user's output readable
        lib.llama_backend_init()
        _LOG_SINK.append(lib.llama_log_callback(lambda level, text, user: None))
        lib.llama_log_set(_LOG_SINK[0], ctypes.c_void_p())
    return lib


def default_threads() -> int:
    """The CPUs this process may run on (llama.cpp's threads spin while they wait: on a loaded machine
    set fewer, e.g. LlamaCppLM(path, n_threads=1))."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


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
        self.threads = n_threads or default_threads()
        self.model = lib.llama_model_load_from_file(str(path).encode(), lib.llama_model_default_params())
        if not self.model:
            raise ValueError(f"llama.cpp could not load {path}: is it a GGUF model file llama.cpp supports?")
        vocab = lib.llama_model_get_vocab(self.model)
        self.vocab_size = int(lib.llama_vocab_n_tokens(vocab))
        self.hidden_size = int(lib.llama_model_n_embd(self.model))
        eos = sorted({int(lib.llama_vocab_eos(vocab)), int(lib.llama_vocab_eot(vocab))} - {-1})
        pad = int(lib.llama_vocab_pad(vocab))
        trained_context = int(lib.llama_model_n_ctx_train(self.model))
        self.config = SimpleNamespace(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, eos_token_id=eos,
            max_position_embeddings=trained_context,
        )  # fmt: skip
        self.generation_config = SimpleNamespace(eos_token_id=eos, pad_token_id=pad if pad >= 0 else None)
        self.name_or_path = str(path)

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
        """The loop's cache over this model (router.engine.layout.model_cache calls it)."""
        return LlamaCppCache(self, vocab)

    def open_context(self, batch: int, hidden: bool):
        """A llama.cpp context for `batch` sequences sharing one KV buffer of `context` tokens."""
        if batch > MAX_SEQUENCES:
            raise ValueError(
                f"llama.cpp decodes at most {MAX_SEQUENCES} sequences in one context, the batch has {batch} rows: "
                f"split it into batches of at most {MAX_SEQUENCES}"
            )
        lib = self._lib
        params = lib.llama_context_default_params()
        params.n_ctx = self.context
        params.n_batch = params.n_ctx  # a whole batch's prompts in one decode
        params.n_ubatch = min(512, params.n_ctx)
        params.n_seq_max = batch
        params.kv_unified = True  # the rows share the buffer: a row uses what it needs, not context / batch
        params.n_threads = params.n_threads_batch = self.threads
        params.embeddings = hidden
        params.pooling_type = lib.LLAMA_POOLING_TYPE_NONE
        ctx = lib.llama_init_from_model(self.model, params)
        if not ctx:
            raise MemoryError(f"llama.cpp could not make a context of {params.n_ctx} tokens for {self.path.name}")
        return ctx

    def __del__(self):
        if getattr(self, "model", None):
            with contextlib.suppress(TypeError, AttributeError):  # at interpreter exit the bindings may be gone
                self._lib.llama_model_free(self.model)
            self.model = None


class LlamaCppCache:
    """`router.engine.layout.CachedModel`'s interface on llama.cpp: row b of the layout is sequence
    `seqs[b]`, holding the row's first `kv_len[b]` real tokens at positions 0..kv_len[b] - 1."""

    def __init__(self, lm: LlamaCppLM, vocab: int):
        self.lm, self.vocab, self._lib = lm, vocab, lm._lib
        self.ctx = None  # made on the first feed, for that batch size
        self.seqs: list[int] = []
        self.kv_len: list[int] = []
        self.n_cached = 0  # columns of the layout fed
        self.forwards, self.row_forwards, self.seconds = 0, 0, 0.0
        self.want_hidden = False
        self.last_hidden = None  # (B, keep, H) of the latest feed when want_hidden

    def feed(self, layout, upto: int, keep: int) -> torch.Tensor:
        """Decode the columns [n_cached, upto) of every row (its real tokens) in one llama_decode and
        return logits (B, keep, V) at the last `keep` columns."""
        started = clock.now()
        batch_rows = layout.tokens.shape[0]
        if self.ctx is None:
            self.ctx = self.lm.open_context(batch_rows, self.want_hidden)
            self.seqs, self.kv_len = list(range(batch_rows)), [0] * batch_rows
        self._forget_rolled_back(layout)
        entries = self._entries(layout, upto, keep)  # (row, column offset, token, position, wants output)
        logits, hidden = self._decode(entries, batch_rows, keep)
        self.n_cached = upto
        self.forwards += 1
        self.row_forwards += batch_rows
        self.last_hidden = hidden
        self.seconds += clock.now() - started
        return logits

    def _forget_rolled_back(self, layout) -> None:
        """Remove from each sequence the tokens the loop turned into holes since the last feed (a rejected
        suffix of the row's real tokens)."""
        lib, kept = self._lib, layout.mask[:, : self.n_cached].sum(-1).tolist()  # (B,) real tokens fed
        memory = lib.llama_get_memory(self.ctx)
        for i, seq in enumerate(self.seqs):
            if self.kv_len[i] > kept[i]:
                lib.llama_memory_seq_rm(memory, seq, kept[i], -1)
                self.kv_len[i] = kept[i]

    def _entries(self, layout, upto: int, keep: int) -> list[tuple[int, int, int, int, bool]]:
        width = upto - self.n_cached
        tokens = layout.tokens[:, self.n_cached : upto].tolist()
        real = layout.mask[:, self.n_cached : upto].tolist()
        entries = []
        for i in range(len(tokens)):
            position = self.kv_len[i]  # llama.cpp's positions are contiguous: the row's real tokens so far
            for j in range(width):
                if real[i][j]:
                    entries.append((i, j - (width - keep), tokens[i][j], position, j >= width - keep))
                    position += 1
            self.kv_len[i] = position
        return entries

    def _decode(self, entries: list, batch_rows: int, keep: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        lib = self._lib
        batch = lib.llama_batch_init(max(len(entries), 1), 0, 1)
        try:
            for k, (i, _, token, position, out) in enumerate(entries):
                batch.token[k], batch.pos[k], batch.n_seq_id[k] = token, position, 1
                batch.seq_id[k][0], batch.logits[k] = self.seqs[i], int(out)
            batch.n_tokens = len(entries)
            if entries and lib.llama_decode(self.ctx, batch) != 0:
                raise RuntimeError(
                    f"llama.cpp could not decode {len(entries)} tokens of {self.lm.path.name} (the batch's context holds "
                    f"{self.lm.context} tokens in all): use smaller batches, shorter prompts or fewer new tokens, or "
                    f"load it with LlamaCppLM(path, context=...) larger"
                )
        finally:
            lib.llama_batch_free(batch)
        logits = np.zeros((batch_rows, keep, self.vocab), dtype=np.float32)  # (B, keep, V)
        hidden = np.zeros((batch_rows, keep, self.lm.hidden_size), dtype=np.float32) if self.want_hidden else None
        for k, (i, col, _, _, out) in enumerate(entries):
            if out:
                logits[i, col] = np.ctypeslib.as_array(lib.llama_get_logits_ith(self.ctx, k), (self.lm.vocab_size,))[
                    : self.vocab
                ]
                if hidden is not None:
                    hidden[i, col] = np.ctypeslib.as_array(
                        lib.llama_get_embeddings_ith(self.ctx, k), (self.lm.hidden_size,)
                    )
        return torch.from_numpy(logits), None if hidden is None else torch.from_numpy(hidden)

    def start_from(self, prefix, batch: int) -> None:
        """A shared prompt prefix is not cached across batches on llama.cpp: the layout holds its columns, and
        the first feed prefills them with the rest of each prompt (same tokens, no reuse between batches)."""

    def crop_to(self, length: int) -> None:
        """Columns past `length` are holes in every row: the next feed removes them from the sequences."""
        self.n_cached = min(self.n_cached, length)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only these rows (finished ones leave the batch): their sequences stay, the others are freed."""
        keep = rows.tolist()
        if self.ctx is not None:
            memory = self._lib.llama_get_memory(self.ctx)
            for i in set(range(len(self.seqs))) - set(keep):
                self._lib.llama_memory_seq_rm(memory, self.seqs[i], -1, -1)
        self.seqs = [self.seqs[i] for i in keep]
        self.kv_len = [self.kv_len[i] for i in keep]

    def __del__(self):
        if getattr(self, "ctx", None):
            with contextlib.suppress(TypeError, AttributeError):  # at interpreter exit the bindings may be gone
                self._lib.llama_free(self.ctx)
            self.ctx = None
