"""Scaler overhead: ours against torch's, measured in the same run on the same tensors.

For 10, 100 and 1000 parameter tensors on CPU, times one ``unscale_ + step + update`` iteration
(SGD, lr=0, so the optimizer's own work is the same for both) and prints the ratio ours / torch.
Rounds alternate between the two implementations (and which goes first), and the fastest round of
each is reported: on a shared 2-core machine the minimum is the least noisy estimate of the cost. The sharded comparison runs on 2 gloo ranks of the harness's
rank pool (``harness.pool.RankPool``), used directly since this runs outside pytest.
"""

from __future__ import annotations

import time

import torch

PARAM_COUNTS = (10, 100, 1000)
ROUNDS = 15
SHARDED_WORLD_SIZE = 2
# Ranks import the body by name; spelled out because under ``python -m ci.bench_scaler`` this
# module's ``__name__`` is ``__main__``, which names nothing inside a rank.
SHARDED_TARGET = "ci.bench_scaler:_on_rank_sharded"


def _setup(n_params: int, scaler_factory):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(64)) for _ in range(n_params)]
    for p in params:
        p.grad = torch.randn(64)
    opt = torch.optim.SGD(params, lr=0.0)
    # init_scale=1 keeps the grads unchanged across iterations (no drift into denormals).
    scaler = scaler_factory()
    scaler.scale(torch.ones(()))
    return scaler, opt


def _time_iterations(scaler, opt, iterations: int) -> tuple[float, float]:
    """(wall, CPU of this thread) seconds per iteration. The thread's CPU time leaves out waiting
    for a peer rank in a collective, which on a shared machine is mostly scheduling noise."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(iterations):
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
    return (time.perf_counter() - wall) / iterations, (time.thread_time() - cpu) / iterations


def compare(
    factories: dict[str, object], n_params: int, iterations: int, barrier=None
) -> dict[str, tuple[float, float]]:
    """Fastest round's (wall, thread CPU) seconds per iteration for each named scaler factory."""
    setups = {name: _setup(n_params, factory) for name, factory in factories.items()}
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in factories}
    for scaler, opt in setups.values():  # warm-up
        _time_iterations(scaler, opt, max(1, iterations // 10))
    order = list(setups)
    for _ in range(ROUNDS):
        for name in order:
            scaler, opt = setups[name]
            if barrier is not None:
                barrier()
            samples[name].append(_time_iterations(scaler, opt, iterations))
        order.reverse()  # neither side always runs first after the barrier
    return {name: (min(w for w, _ in values), min(c for _, c in values)) for name, values in samples.items()}


def _iterations_for(n_params: int) -> int:
    return {10: 400, 100: 100, 1000: 20}[n_params]


def local_rows() -> list[tuple[str, int, tuple[float, float], tuple[float, float]]]:
    from scaler import GradScaler

    factories = {
        "ours": lambda: GradScaler("cpu", init_scale=1.0, growth_interval=10**9),
        "torch": lambda: torch.amp.GradScaler("cpu", init_scale=1.0, growth_interval=10**9),
    }
    rows = []
    for n in PARAM_COUNTS:
        result = compare(factories, n, _iterations_for(n))
        rows.append(("GradScaler", n, result["ours"], result["torch"]))
    return rows


def _on_rank_sharded() -> list[tuple[str, int, tuple[float, float], tuple[float, float]]]:
    import torch.distributed as dist
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchShardedGradScaler

    import harness
    from scaler import ShardedGradScaler

    world_size = harness.current().world_size

    factories = {
        "ours": lambda: ShardedGradScaler("cpu", init_scale=1.0, growth_interval=10**9),
        "torch": lambda: TorchShardedGradScaler("cpu", init_scale=1.0, growth_interval=10**9),
    }
    rows = []
    for n in PARAM_COUNTS:
        result = compare(factories, n, _iterations_for(n), barrier=dist.barrier)
        rows.append((f"ShardedGradScaler (world {world_size})", n, result["ours"], result["torch"]))
    return rows


def sharded_rows() -> list[tuple[str, int, tuple[float, float], tuple[float, float]]]:
    """Rank 0's rows from ``_on_rank_sharded`` on a fresh pool; raises ``RankFailure`` with every
    bad rank's traceback (the harness's own verdict) if any rank did not pass."""
    from harness import DistConfig, RankFailure
    from harness.outcome import judge
    from harness.pool import CaseSpec, RankPool

    pool = RankPool()
    try:
        results = pool.run(
            CaseSpec(
                target=SHARDED_TARGET,
                config=DistConfig(world_size=SHARDED_WORLD_SIZE),
                deadline_s=600.0,
                collective_timeout_s=300.0,
            )
        )
    finally:
        pool.close()
    verdict = judge(results, world_size=SHARDED_WORLD_SIZE)
    if verdict.outcome != "passed":
        raise RankFailure(f"the sharded benchmark did not pass on its ranks:\n{verdict.message}")
    return verdict.values[0]


def main() -> None:
    torch.set_num_threads(1)
    print("Scaler overhead: unscale_ + step + update per iteration, CPU, SGD(lr=0), 64-element params")
    print("wall: elapsed time; cpu: the training thread's CPU time (no waiting for the peer rank)")
    header = f"{'scaler':<30} {'params':>7}"
    for clock in ("wall", "cpu"):
        header += f" {clock + ' ours':>10} {clock + ' torch':>11} {'ratio':>7}"
    print(header + "   (us per iteration)")
    for name, n, ours, theirs in local_rows() + sharded_rows():
        line = f"{name:<30} {n:>7}"
        for mine, other in zip(ours, theirs, strict=True):
            line += f" {mine * 1e6:>10.1f} {other * 1e6:>11.1f} {mine / other:>6.3f}x"
        print(line)


if __name__ == "__main__":
    main()
