"""One side of a cost curve's row, each in a process of its own (``python -m ci.bench.cost_sides SIDE
SIZE WORLD_SIZE``, which prints the side's figures as one JSON line): the check itself (``tool``,
``tool_fn``), the same training without the tool on the same ranks (``plain``, ``plain_fn``), its
``floor`` (the candidate's training and its twin's arithmetic, nothing exchanged for the twin: what
no check on these ranks can go below), and one process training the whole batch (``single``,
``single_fn``: every rank's batch at each step, no process group, nothing of the tool: what the
same steps cost a user on one device).

Why a process per side: peak memory is a process's high-water mark (``VmHWM``), so each side
starts fresh and its peak is its own. A pool side's figures are per process: the controller and
every rank, each at its warm level (``VmRSS`` once ranks are started, the group built,
``transformers`` imported and the workload resolved: what torch and the libraries hold before any
model exists) and at its peak. The time is the case's wall time on the warm pool (the pool's
start, the same for both pool sides, is left out; the tool's controller has imported the tool and
resolved the workload, as every rank has, before the clock starts); the single side's is its
loop's, from building the model (after its own imports and the workload's resolution, which
imports the model's module: ``cost_workloads``). No side's clock runs while Python imports.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from ci.bench.cost_workloads import STEPS, spec
from harness.parity.plan.config import Layout

SIDE_TIMEOUT_S = 1800
SIDES = ("single", "floor", "plain", "tool", "single_fn", "plain_fn", "tool_fn")


# -- rank side: the plain loops -------------------------------------------------------------------
def warm(workload_spec: str) -> None:
    """Warms the pool before anything is timed: ranks started, group built, ``transformers``
    imported and the workload resolved (seconds, the same for both sides)."""
    from harness.parity.workload import registry

    registry.get(workload_spec)


def plain_loops(workload_spec: str, steps: int, exchange: bool = True) -> int:
    """DDP then FSDP2 (units from the workload), ``steps`` steps each, SGD with momentum: the
    training the tool checks, with nothing of the tool. Returns the parameter count.

    ``exchange=False`` (the ``floor`` side): the first loop is the twin's arithmetic alone, each
    rank's own batch through the bare model and its optimizer step, nothing broadcast or reduced.
    No check on these ranks can cost less: it trains the candidate, and its unsharded twin must
    at least run every rank's forward and backward (and step a replica)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    from harness.parity.ranks.sides.full import gather
    from harness.parity.workload import registry
    from harness.parity.workload import units as unit_rules
    from harness.rank import context

    torch.set_num_threads(1)
    workload = registry.get(workload_spec)
    rank = dist.get_rank()
    model = registry.build_model(workload, 0)
    count = sum(p.numel() for p in model.parameters())
    wrapped: list[torch.nn.Module] = [DistributedDataParallel(model) if exchange else model]
    model = registry.build_model(workload, 0)
    classes = unit_rules.resolve(workload, model)
    mesh = gather.mesh("cpu", (dist.get_world_size(),), None)
    for module in reversed([m for m in model.modules() if isinstance(m, classes) and m is not model]):
        fully_shard(module, mesh=mesh, reshard_after_forward=True)
    wrapped.append(fully_shard(model, mesh=mesh, reshard_after_forward=True))
    for net in wrapped:
        optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        for step in range(steps):
            optimizer.zero_grad(set_to_none=True)
            workload.loss(net, registry.make_batch(workload, 0, rank, step)).backward()
            optimizer.step()
            context.heartbeat()  # progress, as the tool's loop reports it: a slow step is no hang
    return count


def plain_function(workload_spec: str, steps: int) -> int:
    """The user's function applied and trained ``steps`` steps with its own optimizer: the training
    a ``function`` row checks, with nothing of the tool. Returns the parameter count."""
    import torch
    import torch.distributed as dist

    from harness.parity.ranks.sides.full import gather
    from harness.parity.workload import registry
    from harness.rank import context

    torch.set_num_threads(1)
    workload = registry.get(workload_spec)
    rank = dist.get_rank()
    model = registry.build_model(workload, 0)
    count = sum(p.numel() for p in model.parameters())
    net = workload.parallelize(model, gather.mesh("cpu", (dist.get_world_size(),), ("dp",)))  # type: ignore[misc]
    optimizer = workload.optimizer(list(net.parameters()))  # type: ignore[misc]
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        workload.loss(net, registry.make_batch(workload, 0, rank, step)).backward()
        optimizer.step()
        context.heartbeat()
    return count


def single(size: str, world_size: int, function: bool = False) -> dict[str, Any]:
    """The same steps in one process: the model built from the same seed, each step every rank's
    batch (the loss averaged over them, as DDP averages), SGD with momentum (``function``: the
    function's own optimizer). No process group, no wrapper, nothing of the tool."""
    import torch

    from harness.controller.memory import rss
    from harness.parity.workload import registry

    torch.set_num_threads(1)
    workload = registry.get(spec(size, function))  # a function's row: its model and optimizer
    started = time.perf_counter()
    model = registry.build_model(workload, 0)
    if workload.optimizer is not None:
        optimizer = workload.optimizer(list(model.parameters()))
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        for rank in range(world_size):
            (workload.loss(model, registry.make_batch(workload, 0, rank, step)) / world_size).backward()
        optimizer.step()
    wall = time.perf_counter() - started
    own = rss(os.getpid())
    peak = own[0] if own is not None else 0
    return {
        "side": "single_fn" if function else "single",
        "size": size,
        "status": "pass",
        "detail": f"one process, {world_size} batches a step",
        "wall_s": wall,
        "peak_bytes": peak,
        "processes": [{"process": "the one process", "peak_bytes": peak}],
    }


# -- one side, in its own process -----------------------------------------------------------------
def measure_side(side: str, size: str, world_size: int = 2) -> dict[str, Any]:
    """``side`` (``tool``, ``plain`` or ``floor``; ``tool_fn``, ``plain_fn``: the user's function;
    ``single``, ``single_fn``: one process) at ``size`` on a fresh pool of ``world_size`` ranks:
    wall seconds and peak bytes, in all and per process (warm and peak)."""
    if side not in SIDES:
        raise ValueError(f"side {side!r}: not one of {', '.join(SIDES)}")
    if side.startswith("single"):
        return single(size, world_size, function=side.endswith("_fn"))
    from harness.controller.memory import rss
    from harness.controller.pool import CaseSpec, RankPool
    from harness.outcome import judge
    from harness.spec import DistConfig

    config = DistConfig(
        world_size=world_size, backend="gloo", deadline_s=SIDE_TIMEOUT_S, collective_timeout_s=600
    )
    pool = RankPool(threads_per_rank=1)
    try:
        function = side.endswith("_fn")
        workload = spec(size, function)
        pool.run(CaseSpec(target=f"{__name__}:warm", config=config, args=(workload,)))
        warm = [figures[1] for pid in pool.pids if (figures := rss(pid)) is not None]
        if side.startswith("tool"):  # the controller warmed as the ranks are (and as ``single``)
            from harness.parity.doors import runner  # noqa: F401 - imported before the clock starts
            from harness.parity.workload import registry

            registry.get(workload)
        own_warm = rss(os.getpid())
        started = time.perf_counter()
        if side.startswith(("plain", "floor")):
            loops = "plain_function" if function else "plain_loops"
            args = (workload, STEPS) if side.startswith("plain") else (workload, STEPS, False)
            case = CaseSpec(target=f"{__name__}:{loops}", config=config, args=args)
            verdict = judge(pool.run(case), world_size=world_size)
            status = verdict.outcome if verdict.outcome != "passed" else "pass"
            detail = verdict.summary
        else:
            from harness.parity.doors import runner
            from harness.parity.plan.config import ParityConfig

            parity = ParityConfig(
                engine="fsdp2",
                workload=workload,
                steps=STEPS,
                world_size=world_size,
                layout=Layout(reshard_after_forward=True),
            )
            if function:  # the function's own row: the plain loop, no fault
                from harness.parity.plan.matrices import user

                parity = user.rows(workload, world_size=world_size)[0].with_(steps=STEPS)
            (outcome,) = runner.run(
                [parity], runner.pool_executor(pool, deadline_per_config_s=600), keep_records=False
            )
            status, detail = outcome.result.status, outcome.result.config.id
        wall = time.perf_counter() - started
        ranks = [figures[0] for pid in pool.pids if (figures := rss(pid)) is not None]
    finally:
        pool.close()
    own = rss(os.getpid())
    controller = own[0] if own is not None else 0
    processes = [
        {
            "process": "controller",
            "warm_bytes": own_warm[1] if own_warm is not None else 0,
            "peak_bytes": controller,
        }
    ]
    processes += [
        {"process": f"rank {rank}", "warm_bytes": before, "peak_bytes": peak}
        for rank, (before, peak) in enumerate(zip(warm, ranks, strict=False))
    ]
    return {
        "side": side,
        "size": size,
        "status": status,
        "detail": detail,
        "wall_s": wall,
        "ranks_peak_bytes": ranks,
        "controller_peak_bytes": controller,
        "peak_bytes": sum(ranks) + controller,
        "processes": processes,
    }


if __name__ == "__main__":
    print(json.dumps(measure_side(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 2)))
