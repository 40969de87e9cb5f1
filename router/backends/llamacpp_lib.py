"""llama.cpp's low-level calls the engine makes (router/backends/llamacpp.py): loading the bindings, a context of
many sequences, and one `llama_decode` of tokens placed on any sequences at any positions.

A context (`Context`) is opened once per model and kept between batches (`LlamaCppLM.lease`): opening one
allocates its compute buffers, and it keeps a shared prompt prefix (a few-shot context) in a sequence of its own,
`PREFIX_SEQ`, that the next batch's rows copy instead of prefilling it again. Its KV buffer is unified: every
sequence takes the cells it needs, and a copied prefix is the same cells, tagged with both sequences.
"""

from __future__ import annotations

import ctypes
import os
import time

import numpy as np

LLAMA_CPP_PYTHON = "0.3.36"  # the pinned llama-cpp-python (scripts/setup.sh)
MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ
PREFIX_SEQ = MAX_SEQUENCES - 1  # the sequence a context keeps a shared prompt prefix in, across batches
ROW_ROOM = 1024  # cells a row may take beyond its first feed (new tokens, drafts, forked branches)
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


def kernels() -> str:
    """The CPU kernels this llama.cpp build has, as its system info lists them: "AVX2" or e.g.
    "AVX512+BF16+VBMI+VNNI" (scripts/llamacpp.sh builds one of the two for the CPU it runs on)."""
    info = llama_cpp().llama_print_system_info().decode()
    have = {k.strip() for k, _, v in (part.partition("=") for part in info.split("|")) if v.strip() == "1"}
    have = {k.removeprefix("CPU :").strip() for k in have}
    extras = [k.removeprefix("AVX512_") for k in sorted(have) if k.startswith("AVX512_")]
    if "AVX512" in have:
        return "+".join(["AVX512", *extras])
    return next((k for k in ("AVX2", "AVX", "SSE3") if k in have), "generic")


def physical_cores() -> int:
    """Physical cores among the CPUs this process may run on (hyperthread siblings counted once)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        try:
            with open(f"{base}/core_id") as core, open(f"{base}/physical_package_id") as package:
                cores.add((package.read().strip(), core.read().strip()))
        except OSError:  # no topology (some containers): count the CPU itself
            cores.add(("cpu", str(cpu)))
    return max(len(cores), 1)


LOADED = 0.5  # other runnable work per core above which one thread is chosen


def other_work(samples: int = 5, every: float = 0.05) -> float:
    """How many other threads are running on this machine now: the kernel's count of runnable threads
    (/proc/loadavg's 4th field, this one included) averaged over a quarter second; the 1-minute load average
    where there is no /proc (it also counts this process's own recent work)."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                counts.append(int(f.read().split()[3].split("/")[0]) - 1)
        except (OSError, ValueError, IndexError):
            return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        if i + 1 < samples:
            time.sleep(every)
    return sum(counts) / len(counts)


def choose_threads(requested: int = 0) -> tuple[int, str]:
    """llama.cpp threads per model, and why: `requested` when > 0; else the physical cores, or 1 when the
    machine is busy with other work (llama.cpp's threads spin while they wait for each other, so two threads
    on a busy 2-core machine run several times slower than one)."""
    if requested > 0:
        return requested, "as set (threads=N)"
    cores, busy = physical_cores(), other_work()
    if cores > 1 and busy > LOADED * cores:
        return (
            1,
            f"the machine is busy ({busy:.1f} other threads running on {cores} cores): 1 thread; threads=N overrides",
        )
    return cores, f"{cores} physical cores, {busy:.1f} other threads running"


class Context:
    """One llama.cpp context: `n_ctx` cells shared by up to MAX_SEQUENCES sequences, and the prefix (token ids)
    sequence PREFIX_SEQ holds, if any."""

    def __init__(self, lib, model, n_ctx: int, threads: int):
        params = lib.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_ctx  # a whole batch's prompts in one decode
        params.n_ubatch = min(512, n_ctx)
        params.n_seq_max = MAX_SEQUENCES  # rows, their forked branches and the prefix
        params.kv_unified = True  # the sequences share the buffer: each uses what it needs
        params.n_threads = params.n_threads_batch = threads
        params.embeddings = False  # switched on per decode where hidden states are read
        params.pooling_type = lib.LLAMA_POOLING_TYPE_NONE
        self.lib, self.n_ctx = lib, n_ctx
        self.handle = lib.llama_init_from_model(model, params)
        if not self.handle:
            raise MemoryError(f"llama.cpp could not make a context of {n_ctx} tokens")
        self.memory = lib.llama_get_memory(self.handle)
        self.n_vocab = int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model)))
        self.hidden_size = int(lib.llama_model_n_embd(model))
        self.prefix: tuple[int, ...] | None = None
        self.hidden = False

    def remove(self, seq: int, start: int = -1) -> None:
        """Drop sequence `seq`'s tokens from position `start` on (-1: all of them)."""
        self.lib.llama_memory_seq_rm(self.memory, seq, start, -1)

    def copy(self, src: int, dst: int, upto: int) -> None:
        """Give `dst` the cells of `src` at positions [0, upto) (the same cells: nothing is recomputed)."""
        self.lib.llama_memory_seq_cp(self.memory, src, dst, 0, upto)

    def keep_prefix_only(self) -> None:
        """Forget every sequence but the prefix's: what a new batch starts from."""
        if self.prefix is None:
            self.lib.llama_memory_clear(self.memory, False)
        else:
            self.lib.llama_memory_seq_keep(self.memory, PREFIX_SEQ)

    def decode(self, entries: list[tuple[int, int, int, bool]], vocab: int, hidden: bool):
        """One llama_decode of entries (sequence, position, token, wants output). Returns logits (n_out, vocab)
        float32 of the entries that want output, in order, and their final hidden states (n_out, H) if `hidden`."""
        lib = self.lib
        if hidden != self.hidden:
            lib.llama_set_embeddings(self.handle, hidden)
            self.hidden = hidden
        batch = lib.llama_batch_init(max(len(entries), 1), 0, 1)
        try:
            for k, (seq, position, token, out) in enumerate(entries):
                batch.token[k], batch.pos[k], batch.n_seq_id[k] = token, position, 1
                batch.seq_id[k][0], batch.logits[k] = seq, int(out)
            batch.n_tokens = len(entries)
            if entries and lib.llama_decode(self.handle, batch) != 0:
                raise RuntimeError(
                    f"llama.cpp could not decode {len(entries)} tokens: its context holds {self.n_ctx} tokens in all; "
                    f"use smaller batches, shorter prompts or fewer new tokens, or load the model with "
                    f"LlamaCppLM(path, context=...) larger"
                )
        finally:
            lib.llama_batch_free(batch)
        wanted = [k for k, entry in enumerate(entries) if entry[3]]
        if not wanted:
            return np.empty((0, vocab), np.float32), np.empty((0, self.hidden_size), np.float32) if hidden else None
        if hidden:  # with embeddings on, llama.cpp outputs every token: read the wanted ones by index
            return self._rows(lib.llama_get_logits_ith, wanted, self.n_vocab)[:, :vocab], self._rows(
                lib.llama_get_embeddings_ith, wanted, self.hidden_size
            )
        # the outputs in batch order (llama_get_logits reorders them), one copy of the rows' first `vocab` logits
        return np.ctypeslib.as_array(lib.llama_get_logits(self.handle), (len(wanted), self.n_vocab))[
            :, :vocab
        ].copy(), None

    def _rows(self, get, indices: list[int], width: int) -> np.ndarray:
        out = np.empty((len(indices), width), dtype=np.float32)
        for i, k in enumerate(indices):
            out[i] = np.ctypeslib.as_array(get(self.handle, k), (width,))
        return out

    def free(self) -> None:
        if self.handle:
            self.lib.llama_free(self.handle)
            self.handle = None
