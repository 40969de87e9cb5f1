"""One job across processes: `torchrun --nproc-per-node N` and `accelerate launch` set RANK,
WORLD_SIZE and LOCAL_RANK; `specroute gen` and `specroute eval` read them here.

Work is split deterministically by rank (`mine`: item i goes to rank i mod N), each rank writes its
own files (record shards, online points), and rank 0 writes what summarises them (the manifest, the
reports) after a barrier. Without those variables everything is one process and every function here
is a no-op, so single-process runs need no launcher. The process group uses gloo on CPU (so the
multi-process path is tested on any machine) and NCCL when each rank has a GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1
    local: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def mine(self, items: list) -> list:
        """This rank's share of items (item i to rank i mod world), in order."""
        return list(items)[self.rank :: self.world]

    def device(self, device: str) -> str:
        """The device this rank uses: `cuda` becomes its own `cuda:<local rank>` when several ranks share a node."""
        return f"cuda:{self.local}" if device == "cuda" and self.world > 1 else device


def ranks() -> Ranks:
    """This process's rank, world size and local rank from the launcher's environment."""
    env = os.environ
    rank = int(env.get("RANK", env.get("LOCAL_RANK", 0)))
    return Ranks(rank, int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", rank)))


def start(device: str = "cpu") -> Ranks:
    """Join the launcher's process group (once) when there are several ranks; return this rank."""
    r = ranks()
    if r.world > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            backend = "nccl" if device.startswith("cuda") else "gloo"
            dist.init_process_group(backend=backend)
    return r


def barrier() -> None:
    """Wait for every rank (no-op in one process)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def gather(obj) -> list:
    """Every rank's obj, in rank order (a list of one in one process)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def rank_suffix() -> str:
    """'' for rank 0 (and single processes), '.rank<r>' otherwise: per-rank lock and log names."""
    r = ranks()
    return "" if r.main else f".rank{r.rank}"
