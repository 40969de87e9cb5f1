"""vLLM's Model Runner V2 acceptance on this CPU, under Triton's interpreter: the four gaps between the interpreter
and vLLM's V2 code, bridged (the recipe of shared/research/vllm-v2/v2_on_cpu.md), and the V2 objects the tests drive.

Import this before triton or vllm (tests/vllm_v2/conftest.py does): it needs TRITON_INTERPRET=1 before triton
loads, and CUDA_VISIBLE_DEVICES="" before vllm loads (vllm.triton_utils then keeps the real triton instead of its
placeholder).
1. Triton 3.8's interpreter has no libdevice: rejection_sampler_utils' `tldevice.log1p` (the residual of
   probabilistic drafts) becomes numpy's.
2. The top-k/top-p kernel asks the platform for its compute units (only sizes its grid) and calls `.to()` on a
   `tl.range` loop variable, which the interpreter yields as a Python int: a constant, and scalar tensors.
3. V2's UvaBuffer pins host memory, which CPU torch refuses: vLLM's own CPU UvaBuffer, as vLLM's CPU runner does.
4. VllmConfig cannot infer a device here: DeviceConfig(device="cpu").
These touch private internals of vLLM 0.32-0.34 and Triton 3.8 (pinned by scripts/setup_vllm_v2.sh).
"""

from __future__ import annotations

import os
import types

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import torch  # noqa: E402

COMPUTE_UNITS = 132  # sizes the top-k/top-p kernel's grid; any positive number works under the interpreter


def _numpy_unary(function):
    def unary(x, _semantic=None):
        import triton.language as tl
        from triton.runtime.interpreter import TensorHandle

        if not isinstance(x, tl.core.tensor):
            return function(x)
        with np.errstate(all="ignore"):
            data = function(x.handle.data).astype(x.handle.data.dtype, copy=False)
        return tl.core.tensor(TensorHandle(data, x.handle.dtype), x.type)

    return unary


def _tensor_range():
    """tl.range yields int32/int64 scalar tensors, as compiled Triton does (tl.static_range stays Python ints)."""
    import triton.language as tl
    import triton.runtime.interpreter as interpreter

    if getattr(interpreter, "_specroute_range", False):
        return
    original = interpreter._patch_lang_core

    def patched(lang, scope):
        original(lang, scope)

        def tensor_range(arg1, arg2=None, step=None, **_kwargs):
            start, end = (0, arg1) if arg2 is None else (arg1, arg2)
            start, end, step = int(start), int(end), int(1 if step is None else step)
            wide = not (-(2**31) <= min(start, end) and max(start, end) < 2**31)
            np_type, tl_type = (np.int64, tl.int64) if wide else (np.int32, tl.int32)
            for i in range(start, end, step):
                yield tl.core.tensor(interpreter.TensorHandle(np.array([i], dtype=np_type), tl_type), tl_type)

        scope.set_attr(lang, "range", tensor_range)

    interpreter._patch_lang_core = patched
    interpreter._specroute_range = True


def bridge():
    """Bridge the interpreter's gaps; returns vLLM's rejection_sampler_utils module."""
    from vllm.triton_utils import HAS_TRITON

    assert os.environ.get("TRITON_INTERPRET") == "1" and HAS_TRITON, "import tests/vllm_v2/interp.py before vllm"
    _tensor_range()
    import vllm.v1.worker.gpu.buffer_utils as gpu_buffers
    import vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils as utils

    utils.tldevice = types.SimpleNamespace(log1p=_numpy_unary(np.log1p), expm1=_numpy_unary(np.expm1))
    try:
        import vllm.v1.sample.ops.topk_topp_triton as topk_topp

        topk_topp.num_compute_units = lambda device_id=None: COMPUTE_UNITS
    except ImportError:
        pass
    from vllm.v1.worker.cpu.buffer_utils import UvaBuffer

    gpu_buffers.UvaBuffer = UvaBuffer
    return utils


def v2_sampler(max_reqs: int, k: int, vocab: int, params: dict):
    """vLLM's own V2 Sampler and RejectionSampler on CPU, with `params` {slot: SamplingParams} added."""
    from vllm.config import DeviceConfig, VllmConfig
    from vllm.v1.worker.gpu.sample.sampler import Sampler
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler
    from vllm.v1.worker.gpu.states import RequestState

    device = torch.device("cpu")
    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    states = RequestState(max_reqs, 256, 256, k, vocab, device)
    sampler = Sampler(config, max_reqs, vocab, device, states, num_speculative_tokens=k)
    for slot, p in params.items():
        sampler.add_request(slot, p)
        states.index_to_req_id[slot] = f"req{slot}-abcdefgh"  # the engine's id: the user's and 8 characters
    sampler.apply_staged_writes()
    # RejectionSampler.__init__ reads only these of SpeculativeConfig (a real one needs a model config)
    spec = types.SimpleNamespace(
        num_speculative_tokens=k,
        rejection_sample_method="standard",
        enable_adaptive_verification=False,
        synthetic_acceptance_rates=None,
        fly_window_size=None,
        fly_entropy_threshold=0.3,
        fly_entropy_top_k=3,
    )
    return RejectionSampler(sampler, spec, device)
