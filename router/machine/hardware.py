"""Which dtype runs fast on this machine, and what the machine is.

`dtype: auto` (the default wherever a model is loaded) means bfloat16 where the hardware multiplies
it natively (CUDA GPUs with bf16 support; CPUs with AMX or AVX512-BF16) and float32 everywhere else.
On a CPU without native bf16 units, torch emulates bf16 matmuls: on an AMD EPYC with AVX2 one
(8 x 1536) @ (1536 x 8960) matmul took 16.8 ms in float32 and 439 ms in bfloat16 (26x slower).
The CPU decision reads torch's capability flags and then confirms them with a short measured probe,
so a hypervisor that hides or half-supports AMX cannot make the default slow.
"""

from __future__ import annotations

import functools
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_CHOICES = ("auto", *DTYPES)
# bf16 counts as native when the probe's bf16 matmul is at most this much slower than float32
# (AMX: ~0.2-0.5x; emulated bf16 on AVX2: 7-26x)
PROBE_TOLERANCE = 1.25
PROBE_SHAPE = (8, 1536, 8960)  # one decoding step's MLP matmul of a 1.5B model, batch 8


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype models are loaded in, and why (printed once, recorded in manifests and eval configs)."""

    dtype: torch.dtype
    reason: str

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def as_dict(self) -> dict:
        return {"dtype": self.name, "reason": self.reason, "cpu": cpu_kind()}


def _cpuinfo_field(name: str) -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(name):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


@functools.lru_cache(maxsize=None)
def cpu_kind() -> str:
    """A short label for this CPU, printed next to every reported figure, e.g.
    'AMD EPYC, AVX2, no native bf16, 2 threads'."""
    model = _cpuinfo_field("model name") or platform.processor() or platform.machine()
    capability, units = torch.backends.cpu.get_cpu_capability(), cpu_bf16_units()
    bf16 = f"native bf16 ({units})" if units else "no native bf16"
    return f"{model}, {capability}, {bf16}, {torch.get_num_threads()} threads"


def cpu_bf16_units() -> str:
    """The CPU's native bf16 matrix units as torch reports them: 'AMX', 'AVX512-BF16', both, or ''."""
    units = []
    if getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)():
        units.append("AMX")
    if getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)():
        units.append("AVX512-BF16")
    return "+".join(units)


PROBE_TRIALS = 7


@functools.lru_cache(maxsize=None)
def bf16_slowdown() -> float:
    """Measured: seconds of a bf16 matmul over seconds of the same float32 matmul on this CPU (the best
    of PROBE_TRIALS of each after a warm-up, interleaved; about 10 ms where bf16 is native). Interleaved
    and the best of several: another job loading the machine slows some trials of both dtypes, not all
    trials of one (with 3 bf16 trials first, a loaded machine once measured native bf16 at 1.63x)."""
    m, k, n = PROBE_SHAPE
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
    pairs = {dtype: (a.to(dtype), b.to(dtype)) for dtype in (torch.bfloat16, torch.float32)}
    best = dict.fromkeys(pairs, float("inf"))
    for x, y in pairs.values():
        x @ y  # warm-up: oneDNN builds its kernel on the first call
    for _ in range(PROBE_TRIALS):
        for dtype, (x, y) in pairs.items():
            start = time.perf_counter()
            x @ y
            best[dtype] = min(best[dtype], time.perf_counter() - start)
    return best[torch.bfloat16] / best[torch.float32]


def _auto_cpu() -> DtypeChoice:
    units = cpu_bf16_units()
    if not units:
        return DtypeChoice(
            torch.float32,
            f"auto: this CPU has no native bf16 (no AMX or AVX512-BF16; torch "
            f"capability {torch.backends.cpu.get_cpu_capability()}), so bf16 "
            f"matmuls would be emulated and many times slower",
        )
    slowdown = bf16_slowdown()
    if slowdown > PROBE_TOLERANCE:
        return DtypeChoice(
            torch.float32,
            f"auto: the CPU reports {units} but a measured bf16 matmul took {slowdown:.2f}x the float32 time",
        )
    return DtypeChoice(
        torch.bfloat16,
        f"auto: native bf16 on this CPU ({units}; measured bf16 matmul {slowdown:.2f}x the float32 time)",
    )


def _auto_cuda(device: str) -> DtypeChoice:
    index = torch.device(device).index
    name = torch.cuda.get_device_name(index)
    if torch.cuda.is_bf16_supported():
        return DtypeChoice(torch.bfloat16, f"auto: CUDA device {name} supports bf16")
    return DtypeChoice(torch.float32, f"auto: CUDA device {name} has no bf16 support")


@functools.lru_cache(maxsize=None)
def resolve_dtype(spec: str | torch.dtype = "auto", device: str = "cpu") -> DtypeChoice:
    """The dtype to load models in: `auto` decides for the machine, a name or torch.dtype wins as given."""
    if isinstance(spec, torch.dtype):
        return DtypeChoice(spec, "set explicitly")
    if spec not in DTYPE_CHOICES:
        raise ValueError(
            f"dtype {spec!r} is not one of {', '.join(DTYPE_CHOICES)}: use auto (bf16 where the "
            f"hardware has it natively, float32 elsewhere) or name one"
        )
    if spec != "auto":
        return DtypeChoice(DTYPES[spec], "set explicitly")
    if str(device).startswith("cuda"):
        return _auto_cuda(str(device))
    return _auto_cpu()


_ANNOUNCED: set = set()


def announce(choice: DtypeChoice, device: str = "cpu") -> None:
    """Print the chosen dtype and why, once per process and choice."""
    key = (choice.dtype, choice.reason, str(device))
    if key in _ANNOUNCED:
        return
    _ANNOUNCED.add(key)
    where = cpu_kind() if not str(device).startswith("cuda") else str(device)
    print(f"[specroute] models in {choice.name} on {where}: {choice.reason}", flush=True)


def machine_kind(device: str) -> str:
    """The CPU kind (with its thread count) or the GPU's name, for a device name: what latencies are
    measured on (eval's online points, gamma calibration)."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return cpu_kind()
