"""Scaler overhead: ours against torch's and against the kernel floor, measured in the same run.

For each configuration (parameter count x size, optimizer) it times, on the same kind of tensors:

- ``floor``: the native ``torch._amp_foreach_non_finite_check_and_unscale_`` over the grads, the
  one kernel a scaler cannot avoid;
- ``step``: the optimizer's own ``step()`` without a scaler;
- ``ours`` / ``torch``: one ``unscale_ + step + update`` iteration, minus ``step``: what the
  scaler adds on top of the optimizer.

and prints microseconds per iteration, each scaler's ratio to the floor and ours / torch. For a
non-fused optimizer the scaler's work does not depend on what ``step()`` computes, so those rows
use an optimizer whose ``step()`` does nothing (subtracting a full optimizer pass from a noisy
total would bury the overhead of large tensors in noise). The fused row uses Adam(fused=True),
lr=0: there the scaler's share includes the kernel's own unscaling. The scale is 1, so the grads
stay the same across iterations. Rounds interleave all four measurements (reversing their order each round) and the
fastest round of each is reported: on a shared machine the minimum is the least noisy estimate
of the cost. The sharded comparison runs on 2 gloo ranks of the harness's rank pool
(``harness.controller.pool.RankPool``, used directly since this runs outside pytest); its ``allreduce``
column is one bare all_reduce of a float32 scalar on the same group, which the sharded scalers
add on top of the floor.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

ROUNDS = 15
SHARDED_WORLD_SIZE = 2
# Ranks import the body by name; spelled out because under ``python -m ci.bench.scaler_overhead``
# this module's ``__name__`` is ``__main__``, which names nothing inside a rank.
SHARDED_TARGET = "ci.bench.scaler_overhead:_on_rank_sharded"


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    """One benchmarked shape of work."""

    label: str
    """How the row is named, e.g. ``1000 x 4096``."""
    n_params: int
    """Number of parameter tensors."""
    numel: int
    """Elements per parameter (float32)."""
    iterations: int
    """Iterations per timed round."""
    optimizer: str = "no_step"
    """``no_step`` (an optimizer whose step does nothing) or ``adam_fused`` (Adam(fused=True), lr=0)."""


CONFIGS = (
    Config(label="10 x 4096", n_params=10, numel=4096, iterations=300),
    Config(label="100 x 4096", n_params=100, numel=4096, iterations=40),
    Config(label="1000 x 4096", n_params=1000, numel=4096, iterations=5),
    Config(label="20 x 1M", n_params=20, numel=1 << 20, iterations=2),
    Config(label="1000 x 4096, fused Adam", n_params=1000, numel=4096, iterations=5, optimizer="adam_fused"),
)
SHARDED_CONFIGS = CONFIGS[:4]


class NoStep(torch.optim.Optimizer):
    """An optimizer whose ``step()`` changes nothing: what a scaler does around it is all there is."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        super().__init__(params, {})

    def step(self, closure: None = None) -> None:
        return None


def _optimizer(config: Config) -> tuple[list[torch.nn.Parameter], torch.optim.Optimizer]:
    generator = torch.Generator().manual_seed(0)
    params = [
        torch.nn.Parameter(torch.randn(config.numel, generator=generator)) for _ in range(config.n_params)
    ]
    for param in params:
        param.grad = torch.randn(config.numel, generator=generator)
    if config.optimizer == "adam_fused":
        return params, torch.optim.Adam(params, lr=0.0, fused=True)
    return params, NoStep(params)


def _floor(config: Config) -> Callable[[], None]:
    params, _ = _optimizer(config)
    grads = [param.grad for param in params]
    found_inf, inv_scale = torch.zeros(()), torch.ones(())
    return lambda: torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)


def _step(config: Config) -> Callable[[], None]:
    return _optimizer(config)[1].step


def _iteration(config: Config, factory: Callable[[], object]) -> Callable[[], None]:
    _, opt = _optimizer(config)
    # init_scale=1 keeps the grads unchanged across iterations (no drift into denormals).
    scaler = factory()
    scaler.scale(torch.ones(()))

    def iteration() -> None:
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()

    return iteration


def _time(fn: Callable[[], None], iterations: int) -> float:
    """CPU seconds of this thread per call. Not wall time: on a shared machine wall time mostly
    measures who else got the cores, and on 2 ranks it includes waiting for the peer rank."""
    start = time.thread_time()
    for _ in range(iterations):
        fn()
    return (time.thread_time() - start) / iterations


def measure(
    config: Config, factories: dict[str, Callable[[], object]], barrier: Callable[[], None] | None = None
) -> dict[str, float]:
    """Fastest round's seconds per iteration: ``floor``, ``step`` and each factory's scaler beyond
    the optimizer's step."""
    fns = {"floor": _floor(config), "step": _step(config)}
    fns.update({name: _iteration(config, factory) for name, factory in factories.items()})
    for fn in fns.values():  # warm-up
        _time(fn, max(1, config.iterations // 5))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    for _ in range(ROUNDS):
        for name in order:
            if barrier is not None:
                barrier()
            samples[name].append(_time(fns[name], config.iterations))
        order.reverse()  # no measurement always runs first after the barrier
    best = {name: min(values) for name, values in samples.items()}
    return {name: best[name] - (best["step"] if name in factories else 0.0) for name in best}


def local_rows() -> list[tuple[str, str, dict[str, float]]]:
    from scaler import GradScaler

    factories = {
        "ours": lambda: GradScaler("cpu", init_scale=1.0, growth_interval=10**9),
        "torch": lambda: torch.amp.GradScaler("cpu", init_scale=1.0, growth_interval=10**9),
    }
    return [("GradScaler", config.label, measure(config, factories)) for config in CONFIGS]


def world_of_one_rows() -> list[tuple[str, str, dict[str, float]]]:
    """The sharded scalers on a 1-rank gloo group in this process: their host work and one trivial
    collective, without a peer rank to wait for."""
    import torch.distributed as dist
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchShardedGradScaler

    from scaler import ShardedGradScaler

    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        factories = {
            "ours": lambda: ShardedGradScaler("cpu", init_scale=1.0, growth_interval=10**9),
            "torch": lambda: TorchShardedGradScaler("cpu", init_scale=1.0, growth_interval=10**9),
        }
        all_reduce = _bare_all_reduce(lambda: None)
        rows = []
        for config in SHARDED_CONFIGS:
            row = measure(config, factories)
            row["allreduce"] = all_reduce
            rows.append(("ShardedGradScaler (world 1)", config.label, row))
        return rows
    finally:
        dist.destroy_process_group()


def _bare_all_reduce(barrier: Callable[[], None]) -> float:
    import torch.distributed as dist

    flag = torch.zeros(())
    best = float("inf")
    for _ in range(ROUNDS):
        barrier()
        best = min(best, _time(lambda: dist.all_reduce(flag, op=dist.ReduceOp.MAX), 50))
    return best


def _on_rank_sharded() -> list[tuple[str, str, dict[str, float]]]:
    import torch.distributed as dist
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchShardedGradScaler

    import harness
    from scaler import ShardedGradScaler

    world_size = harness.current().world_size
    factories = {
        "ours": lambda: ShardedGradScaler("cpu", init_scale=1.0, growth_interval=10**9),
        "torch": lambda: TorchShardedGradScaler("cpu", init_scale=1.0, growth_interval=10**9),
    }
    all_reduce = _bare_all_reduce(dist.barrier)
    rows = []
    for config in SHARDED_CONFIGS:
        row = measure(config, factories, barrier=dist.barrier)
        row["allreduce"] = all_reduce
        rows.append((f"ShardedGradScaler (world {world_size})", config.label, row))
    return rows


def sharded_rows() -> list[tuple[str, str, dict[str, float]]]:
    """Rank 0's rows from ``_on_rank_sharded`` on a fresh pool; raises ``RankFailure`` with every
    bad rank's traceback (the harness's own verdict) if any rank did not pass."""
    from harness import DistConfig, RankFailure
    from harness.controller.pool import CaseSpec, RankPool
    from harness.outcome import judge

    pool = RankPool()
    try:
        results = pool.run(
            CaseSpec(
                target=SHARDED_TARGET,
                config=DistConfig(world_size=SHARDED_WORLD_SIZE),
                deadline_s=900.0,
                collective_timeout_s=450.0,
            )
        )
    finally:
        pool.close()
    verdict = judge(results, world_size=SHARDED_WORLD_SIZE)
    if verdict.outcome != "passed":
        raise RankFailure(f"the sharded benchmark did not pass on its ranks:\n{verdict.message}")
    return verdict.values[0]


def as_rows(rows: list[tuple[str, str, dict[str, float]]]) -> list[dict[str, object]]:
    """The measured rows as JSON-ready dicts: microseconds, and the ratios the table prints."""
    out: list[dict[str, object]] = []
    for name, label, row in rows:
        us = {f"{key}_us": round(value * 1e6, 3) for key, value in row.items()}
        out.append(
            {
                "scaler": name,
                "params": label,
                **us,
                "ours_per_floor": round(row["ours"] / row["floor"], 3),
                "torch_per_floor": round(row["torch"] / row["floor"], 3),
                "ours_per_torch": round(row["ours"] / row["torch"], 3),
            }
        )
    return out


def measure_all() -> dict[str, object]:
    """Every row (local, world of one, 2 ranks), as :func:`as_rows` gives them."""
    torch.set_num_threads(1)
    return {
        "unit": f"us per unscale_ + step + update beyond the optimizer's step, thread CPU time, fastest of {ROUNDS} rounds",
        "rows": as_rows(local_rows() + world_of_one_rows() + sharded_rows()),
    }


HEADER = [
    "Scaler overhead on CPU: us per unscale_ + step + update beyond the optimizer's own step,",
    "in CPU time of the training thread (waiting for a peer rank or the scheduler left out)",
    "floor: torch._amp_foreach_non_finite_check_and_unscale_ over the same grads; step: the",
    f"optimizer alone (one whose step does nothing, or Adam(fused=True) lr=0); fastest of {ROUNDS} rounds",
]


def render(measured: dict[str, object]) -> str:
    """The table: microseconds per iteration and ratios (ours/floor, torch/floor, ours/torch)."""
    lines = [
        *HEADER,
        f"{'scaler':<30} {'params':<24} {'floor':>8} {'step':>9} {'ours':>8} {'torch':>8} "
        f"{'ours/floor':>10} {'torch/floor':>11} {'ours/torch':>10} {'allreduce':>9}",
    ]
    for row in measured["rows"]:  # type: ignore[union-attr]
        all_reduce = f"{row['allreduce_us']:>9.1f}" if "allreduce_us" in row else f"{'':>9}"
        lines.append(
            f"{row['scaler']:<30} {row['params']:<24} {row['floor_us']:>8.1f} {row['step_us']:>9.1f} "
            f"{row['ours_us']:>8.1f} {row['torch_us']:>8.1f} {row['ours_per_floor']:>9.2f}x "
            f"{row['torch_per_floor']:>10.2f}x {row['ours_per_torch']:>9.2f}x {all_reduce}"
        )
    return "\n".join(lines)


def main() -> None:
    print(render(measure_all()))


if __name__ == "__main__":
    main()
