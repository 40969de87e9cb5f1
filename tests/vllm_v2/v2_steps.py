"""Random speculative steps in Model Runner V2's layout, and both acceptances on them: vLLM's own
`RejectionSampler._verify` (its Triton kernels, interpreted) and the plugin's (router/vllm/runner_v2.py)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
import torch
from interp import v2_sampler

from router.vllm.counts import Counts
from router.vllm.settings import PluginSettings
from router.vllm.step import Engine


@dataclass
class Request:
    """One request of a step: its slot, drafts made, and sampling settings."""

    slot: int
    drafts: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    extra: dict | None = None


def engine(policy, alpha: float = 0.0) -> Engine:
    return Engine(PluginSettings(policy, alpha, None, False), Counts())


def params_of(r: Request):
    from vllm import SamplingParams

    return SamplingParams(
        temperature=r.temperature, top_k=r.top_k or 0, top_p=r.top_p, seed=r.seed, extra_args=r.extra, max_tokens=16
    )


class V2Step:
    """One step's inputs for RejectionSampler._verify (shapes in comments), with vLLM's own samplers built for it."""

    def __init__(self, requests: list[Request], k: int, vocab: int, seed: int = 0, scale: float = 2.0, same=False):
        g = torch.Generator().manual_seed(seed)
        self.requests, self.k, self.vocab = requests, k, vocab
        max_reqs = max(r.slot for r in requests) + 1
        self.rs = v2_sampler(max_reqs, k, vocab, {r.slot: params_of(r) for r in requests})
        self.q = torch.randn(max_reqs, k, vocab, generator=g) * scale  # (max_reqs, K, V) the drafter's, by slot
        rows = [r.drafts + 1 for r in requests]
        self.cu = torch.tensor(np.cumsum([0, *rows]), dtype=torch.int32)  # (R + 1,)
        self.logits = torch.randn(int(self.cu[-1]), vocab, generator=g) * scale  # (N, V) the verifier's, raw
        for i, r in enumerate(requests):  # the verifier near the drafter, so that some drafts are kept
            start = int(self.cu[i])
            self.logits[start : start + r.drafts] = (
                self.q[r.slot, : r.drafts] + 0.3 * self.logits[start : start + r.drafts]
            )
            if same:  # every request the first's distributions: one law to sample
                self.q[r.slot] = self.q[requests[0].slot]
                self.logits[start : start + r.drafts + 1] = self.logits[: r.drafts + 1]
        sampled, pos, eidx, local = [], [], [], []
        for i, r in enumerate(requests):
            drafts = [self._draft(r, j, g) for j in range(r.drafts)]
            sampled += [0, *drafts]  # the row-0 token is not a draft: vLLM does not read it
            pos += [100 * (i + 1) + j for j in range(r.drafts + 1)]
            eidx += [r.slot] * (r.drafts + 1)
            local += list(range(r.drafts + 1))
        slots = [r.slot for r in requests]
        self.inputs = dict(
            logits=self.logits,
            draft_logits=self._cache(max_reqs),
            draft_sampled=torch.tensor(sampled),
            pos=torch.tensor(pos),
            cu_num_logits=self.cu,
            idx_mapping=torch.tensor(slots, dtype=torch.int32),
            idx_mapping_np=np.array(slots, dtype=np.int32),
            expanded_idx_mapping=torch.tensor(eidx, dtype=torch.int32),
            expanded_local_pos=torch.tensor(local, dtype=torch.int32),
            seq_lens_upper_bound_np=np.full(len(slots), 256, dtype=np.int32),
        )

    def _draft(self, r: Request, j: int, g: torch.Generator) -> int:
        """A draft as V2 draws it: the argmax at temperature 0, else from softmax(q / T) (no top-k, no top-p)."""
        q = self.q[r.slot, j]
        if r.temperature == 0:
            return int(q.argmax())
        return int(torch.multinomial((q / r.temperature).softmax(-1), 1, generator=g))

    def _cache(self, max_reqs: int):
        """The drafter's cached logits: a DraftLogitsCache (0.34) or the plain tensor (0.32, 0.33)."""
        from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

        kind = inspect.signature(RejectionSampler._verify).parameters["draft_logits"].annotation
        if "DraftLogitsCache" not in str(kind):
            return self.q.clone()
        from vllm.v1.worker.gpu.spec_decode.draft_logits import DraftLogitsCache

        cache = DraftLogitsCache(max_reqs, self.k, self.vocab, dtype=torch.float32, fill=0.0, device="cpu")
        cache.values.copy_(self.q)
        return cache

    def kwargs(self) -> dict:
        from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

        params = inspect.signature(RejectionSampler._verify).parameters
        named = dict(self.inputs)
        if "verify_draft_sampled" in params:  # 0.32/0.33's trailing argument
            named["verify_draft_sampled"] = named["draft_sampled"]
        return {k: v for k, v in named.items() if k in params}

    def vllm(self) -> list[list[int]]:
        """Each request's tokens from vLLM's own _verify."""
        from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

        _, sampled, n = RejectionSampler._verify(self.rs, **self.kwargs())
        return [sampled[i, : int(n[i])].tolist() for i in range(len(self.requests))]

    def plugin(self, eng: Engine) -> list[list[int]]:
        """Each request's tokens from the plugin's V2 acceptance on the same inputs."""
        from router.vllm.runner_v2 import verify_step

        _, sampled, n = verify_step(eng, self.rs, **self.kwargs())
        return [sampled[i, : int(n[i])].tolist() for i in range(len(self.requests))]
