"""``torchrun ... -m harness.parity``: the same configurations at the launched world size, over
``env://`` (one or several machines, gloo or NCCL).

Usage (on every node; ``--standalone`` or a c10d rendezvous on one machine)::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m harness.parity --backend nccl --workload my_workloads:resmlp

Why in-process: the warm pool lives on one host; across hosts torchrun starts the ranks, so every
process is a rank *and* runs the controller's loop (``runner.run``) over the same configurations
in the same order. The executor runs ``entry.run_batch`` here and exchanges every rank's
results through the rendezvous store (not a collective: after a failed configuration the ranks
re-create the process group, and the store outlives it). Every process judges the same data;
global rank 0 prints progress, writes the reports once, and publishes its verdict, with which
every process exits (0 held, 1 a configuration broke its tolerance).
"""

from __future__ import annotations

import faulthandler
import os
import pickle
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from harness.parity.plan.config import ParityConfig
from harness.rank import context
from harness.torch_private import c10d

_RESULTS_TIMEOUT_S = 600.0


def launched() -> bool:
    """Whether this process was started by torchrun (or another ``env://`` launcher)."""
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def world_size() -> int:
    return int(os.environ["WORLD_SIZE"])


class Launched:
    """This process's rank: its process group, device and store, and the executor over them."""

    def __init__(self, backend: str, *, deadline_per_config_s: float) -> None:
        import torch
        import torch.distributed as dist

        self.rank = int(os.environ["RANK"])
        self.world_size = world_size()
        self.backend = backend
        self.deadline_per_config_s = deadline_per_config_s
        local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        self.device = torch.device("cpu")
        if backend == "nccl":
            self.device = torch.device("cuda", local_rank)
            torch.cuda.set_device(self.device)
        self.timeout = timedelta(seconds=deadline_per_config_s)
        dist.init_process_group(backend, init_method="env://", timeout=self.timeout)
        context.advance_group_generation()
        self.base_store = c10d.default_store()
        self.batches = 0

    def _reset_group(self, suffix: str) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        store = dist.PrefixStore(f"shardscale-parity-reset/b{self.batches}/{suffix}/", self.base_store)
        dist.init_process_group(
            self.backend, store=store, rank=self.rank, world_size=self.world_size, timeout=self.timeout
        )
        context.advance_group_generation()

    def execute(
        self, batch: list[Any], backend: str, world_size: int, target: str | None = None
    ) -> list[list[Any]]:
        """A ``runner.Executor``: run ``batch`` on this rank (configurations, or with
        ``target=runner.LOCALIZE_TARGET`` the localization requests of failed ones), return every
        rank's results."""
        import torch.distributed as dist

        from harness.parity.doors import runner

        run_batch = runner.rank_function(target or runner.RANK_TARGET)

        assert backend == self.backend and world_size == self.world_size, (backend, world_size)
        self.batches += 1
        store = dist.PrefixStore(f"shardscale-parity/b{self.batches}/", self.base_store)
        context._set_current(
            context.RankContext(
                rank=self.rank,
                world_size=self.world_size,
                backend=self.backend,
                device=self.device,
                store=store,
                reset_group=self._reset_group,
                mode="torchrun",
            )
        )
        faulthandler.dump_traceback_later(30.0 + self.deadline_per_config_s * len(batch), exit=True)
        try:
            mine = run_batch(batch)
        finally:
            faulthandler.cancel_dump_traceback_later()
            context._set_current(None)
        store.set(f"results/{self.rank}", pickle.dumps(mine))
        keys = [f"results/{r}" for r in range(self.world_size)]
        store.wait(keys, timedelta(seconds=_RESULTS_TIMEOUT_S))
        return [pickle.loads(store.get(key)) for key in keys]

    def agree_on_exit(self, status: int) -> int:
        """Rank 0's exit status, on every rank (rank 0 returns once every rank has read it, so the
        store it may host outlives the reads)."""
        store, key = self.base_store, "shardscale-parity/exit"
        if self.rank == 0:
            store.set(key, str(status))
        store.wait([key], timedelta(seconds=_RESULTS_TIMEOUT_S))
        agreed = int(store.get(key))
        store.set(f"{key}/read/{self.rank}", b"1")
        if self.rank == 0:
            reads = [f"{key}/read/{r}" for r in range(self.world_size)]
            store.wait(reads, timedelta(seconds=_RESULTS_TIMEOUT_S))
        return agreed

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def run(
    configs: list[ParityConfig],
    *,
    backend: str,
    deadline_per_config_s: float,
    batch_size: int,
    gpus: int,
    on_progress: Callable[[Any], None] | None,
    finish: Callable[[list[Any]], int],
    drift: bool = False,
    ground_truth: bool = False,
) -> int:
    """Run ``configs`` on the launched ranks; ``finish(results)`` (reports, verdict) runs on rank 0
    only and its status is every process's exit status."""
    from harness.parity.doors import runner

    rank = Launched(backend, deadline_per_config_s=deadline_per_config_s)
    try:
        outcomes = runner.run(
            configs,
            rank.execute,
            gpus=gpus,
            batch_size=batch_size,
            keep_records=False,
            on_progress=on_progress if rank.rank == 0 else None,
            drift=drift,
            ground_truth=ground_truth,
        )
        status = finish([outcome.result for outcome in outcomes]) if rank.rank == 0 else 0
        return rank.agree_on_exit(status)
    finally:
        rank.close()
