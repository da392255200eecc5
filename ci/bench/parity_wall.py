"""Parity matrix speed: the whole CPU matrix on the warm pool against one spawn per configuration.

``make bench`` calls :func:`measure` and :func:`render`. The matrix runs as ``make parity`` runs it (fresh
rank pools, :class:`harness.controller.pool.RankPool`, two groups of ranks at once, batches of
configurations, cached references), and its wall time includes starting the pools; it runs again on one group, for what the
second saves. The alternative, what PyTorch's ``MultiProcessTestCase`` does for every
test, spawns fresh ranks (``spawn``: a new interpreter importing torch) for each configuration,
builds a process group and runs the same ``entry.run_batch([config])``; it is timed on a
sample (``SAMPLE`` configurations spread over the matrix) and extrapolated to the matrix's size.

The user-workload overhead: what the tool costs a user over training their model. The matrix of a
workload (``USER_WORKLOAD``, as ``python -m harness.parity --workload`` runs it, on a fresh pool)
against a plain loop in this process training the same model for the same number of steps (each
configuration's candidate and reference steps): no wrapper, no scaler, no recording, no gather.

Localization runs only for failing configurations, so a passing matrix pays nothing for it; its
cost per failing configuration is measured on configurations with a planted bug
(``fixtures/parity_plants.py``): each judged with and without localization on the same warm pool,
the difference divided by their number (and, apart, the ranks' own re-run time).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import warnings

from harness.parity.doors import lanes, runner
from harness.parity.plan.config import ParityConfig, unsupported_reason
from harness.parity.plan.matrices import default as matrix

SAMPLE = 6
USER_WORKLOAD = "llama"
"""A built-in that looks like a user's model, resolved as a user's is."""


def _spawned_rank(rank: int, world_size: int, store_path: str, config: ParityConfig) -> None:
    import torch
    import torch.distributed as dist

    from harness.parity.ranks import entry
    from harness.rank import context

    warnings.simplefilter("ignore", FutureWarning)
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    context._set_current(
        context.RankContext(
            rank=rank,
            world_size=world_size,
            backend="gloo",
            device=torch.device("cpu"),
            store=dist.PrefixStore("case/", store),
            reset_group=lambda suffix: None,
        )
    )
    (result,) = entry.run_batch([config])
    if result.candidate is None or result.candidate.error:
        raise RuntimeError(f"{config.id} failed on rank {rank}")
    dist.destroy_process_group()


def spawn_one(config: ParityConfig) -> float:
    """Seconds to run ``config`` on freshly spawned ranks (start, rendezvous, run, exit)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="shardscale-spawn-") as tmp:
        started = time.perf_counter()
        mp.start_processes(
            _spawned_rank,
            args=(config.world_size, os.path.join(tmp, "store"), config),
            nprocs=config.world_size,
            start_method="spawn",
        )
        return time.perf_counter() - started


def _on_pool(configs: list[ParityConfig], jobs: int = 1) -> tuple[float, list[runner.Outcome]]:
    """The wall time of ``configs`` on ``jobs`` fresh groups of ranks (their start included)."""
    from harness.controller.pool import RankPool

    started = time.perf_counter()
    pools = [RankPool(threads_per_rank=1) for _ in range(jobs)]
    executors = [runner.pool_executor(pool) for pool in pools]
    try:
        outcomes = runner.run(configs, executors[0], parallel=executors[1:], keep_records=False)
    finally:
        for pool in pools:
            pool.close()
    return time.perf_counter() - started, outcomes


def _localization_on_a_pool() -> dict[str, object]:
    from harness.controller.pool import RankPool

    pool = RankPool(threads_per_rank=1)
    try:
        return measure_localization(pool)
    except Exception as error:  # noqa: BLE001 - reported in the table, not fatal to the bench
        return {"error": f"{type(error).__name__}: {error}"}
    finally:
        pool.close()


def plain_loop(workload_name: str, steps: int) -> float:
    """Seconds to train the workload's model for ``steps`` steps in a plain loop (fp32, SGD)."""
    import torch

    from harness.parity.workload import registry

    workload = registry.get(workload_name)
    torch.set_num_threads(1)
    model = registry.build_model(workload, 0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    started = time.perf_counter()
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        workload.loss(model, registry.make_batch(workload, 0, 0, step)).backward()
        optimizer.step()
    return time.perf_counter() - started


def measure_user_workload(name: str = USER_WORKLOAD) -> dict[str, object]:
    """The tool's wall time on one workload's matrix against the same steps in a plain loop."""
    from harness.parity.plan.matrices import workload as workload_matrix
    from harness.parity.workload import registry

    configs = [c for c in workload_matrix.for_workload(name) if unsupported_reason(c) is None]
    size = sum(p.numel() for p in registry.build_model(registry.get(name), 0).parameters())
    jobs = lanes.for_sizes([size])  # the CLI's default for it
    wall, _ = _on_pool(configs, jobs)
    steps = 2 * sum(c.steps for c in configs)  # candidate and reference, per rank
    plain = plain_loop(name, steps)
    return {
        "workload": name,
        "configs": len(configs),
        "jobs": jobs,
        "steps": steps,
        "tool_wall_s": wall,
        "plain_loop_s": plain,
        "ratio_tool_per_plain": wall / plain,
    }


def measure() -> dict[str, object]:

    configs = [c for c in matrix.default_matrix() if unsupported_reason(c) is None]
    wall, outcomes = _on_pool(configs, lanes.SMALL_JOBS)  # as make parity runs it
    one_group, _ = _on_pool(configs, 1)
    broken = [o.result.config.id for o in outcomes if o.result.broken]
    step = max(1, len(configs) // SAMPLE)
    sample = configs[::step][:SAMPLE]
    spawned, failed = [], []
    for config in sample:
        try:
            spawned.append(spawn_one(config))
        except Exception as error:  # noqa: BLE001 - a failed spawn is reported, not fatal to the bench
            failed.append(f"{config.id}: {error}")
    if not spawned:
        raise RuntimeError("every spawned configuration failed:\n" + "\n".join(failed))
    spawn_mean = statistics.fmean(spawned)
    return {
        "configs": len(configs),
        "broken": len(broken),
        "matrix_wall_s": wall,
        "jobs": lanes.SMALL_JOBS,
        "one_group_wall_s": one_group,
        "ratio_one_group_per_jobs": one_group / wall,
        "per_config_warm_s": wall / len(configs),
        "spawn_per_config_s": spawn_mean,
        "spawn_extrapolated_s": spawn_mean * len(configs),
        "ratio_spawn_per_warm": spawn_mean * len(configs) / wall,
        "spawn_sample": len(spawned),
        "spawn_failures": failed,
        "by_recipe": cost_by_recipe(outcomes),
        "loop_rows": loop_rows(outcomes),
        "user_workload": measure_user_workload(),
        "localization": _localization_on_a_pool(),
    }


def cost_by_recipe(outcomes: list[runner.Outcome]) -> dict[str, dict[str, float]]:
    """What each precision recipe's rows cost in the matrix (``fp32``, ``pure-bf16``,
    ``autocast-fp16``, ...): their count and their summed time in the row (the candidate's run,
    plus the reference's where no earlier row shared it)."""
    found: dict[str, dict[str, float]] = {}
    for outcome in outcomes:
        entry = found.setdefault(outcome.result.config.recipe_name, {"configs": 0, "time_s": 0.0})
        entry["configs"] += 1
        entry["time_s"] += outcome.result.time_s
    return found


def _planted_executor(pool: object, plant: object) -> runner.Executor:
    from harness.controller.pool import CaseSpec
    from harness.outcome import judge
    from harness.spec import DistConfig

    def execute(batch, backend, world_size, target=runner.RANK_TARGET):  # type: ignore[no-untyped-def]
        name = {runner.LOCALIZE_TARGET: "localize_batch", runner.STAGED_TARGET: "staged_batch"}.get(
            target, "run_batch"
        )
        config = DistConfig(
            world_size=world_size, backend=backend, deadline_s=300.0, collective_timeout_s=60.0
        )
        spec = CaseSpec.of(
            f"fixtures.parity_plants:{name}", config, args=(plant, batch), default_deadline_s=300.0
        )
        verdict = judge(pool.run(spec), world_size=world_size)  # type: ignore[attr-defined]
        if verdict.outcome != "passed":
            raise runner.BatchFailed(verdict.message or verdict.summary)
        return verdict.values

    return execute


def measure_localization(pool: object) -> dict[str, object]:
    """Seconds localization adds per failing configuration (planted bugs, warm pool)."""
    from fixtures.parity_plants import Plant

    fsdp2 = {"engine": "fsdp2", "reshard_after_forward": True, "optimizer": "sgd"}
    cases = [
        (ParityConfig.from_flat(**fsdp2), Plant(kind="output_ulp", module="inner.1.linear")),
        (
            ParityConfig.from_flat(workload="transformer", **fsdp2),
            Plant(kind="output_scale", module="blocks.1", amount=1e-2),
        ),
        (ParityConfig.from_flat(**fsdp2), Plant(kind="grad_factor", amount=2.0)),
    ]
    started = time.perf_counter()
    plain = with_localization = ranks_s = 0.0
    for config, plant in cases:
        execute = _planted_executor(pool, plant)
        runner.run([config], execute, localize=False)  # warm: references cached, group made
        begun = time.perf_counter()
        runner.run([config], execute, localize=False)
        plain += time.perf_counter() - begun
        begun = time.perf_counter()
        (outcome,) = runner.run([config], execute)
        with_localization += time.perf_counter() - begun
        found = outcome.result.localization
        ranks_s += found.duration_s if found is not None else 0.0
    return {
        "failing_configs": len(cases),
        "judge_s": plain / len(cases),
        "judge_and_localize_s": with_localization / len(cases),
        "per_failing_config_s": (with_localization - plain) / len(cases),
        "ranks_rerun_s": ranks_s / len(cases),
        "total_s": time.perf_counter() - started,
    }


def _loop_feature(config: ParityConfig) -> str | None:
    if config.loop.clip != 1.0:
        return "clip"
    if config.loop.accumulate > 1:
        return "accumulate"
    return "checkpoint" if config.loop.checkpoint else None


def loop_rows(outcomes: list[runner.Outcome]) -> dict[str, dict[str, float]]:
    """What the default matrix's loop rows cost (issue 24): by feature, their count and the sum of
    their configurations' times (reference runs they trigger included, cached ones shared)."""
    found: dict[str, dict[str, float]] = {}
    for outcome in outcomes:
        feature = _loop_feature(outcome.result.config)
        if feature is not None:
            row = found.setdefault(feature, {"rows": 0, "time_s": 0.0})
            row["rows"] += 1
            row["time_s"] += outcome.result.time_s
    return found


def _render_loop(found: object) -> list[str]:
    if not isinstance(found, dict) or not found:  # a bench.json written before the loop rows
        return []
    said = ", ".join(f"{name} {v['rows']:.0f} rows {v['time_s']:.2f} s" for name, v in found.items())
    return [f"loop rows of the matrix:   {said}"]


def render(m: dict[str, object]) -> str:
    extrapolated = m["spawn_extrapolated_s"]
    return "\n".join(
        [
            "parity matrix (gloo, world size 2)",
            "-" * 72,
            f"warm pool, whole matrix:   {m['matrix_wall_s']:7.1f} s for {m['configs']} configurations "
            f"({m['per_config_warm_s'] * 1e3:.0f} ms each, {m['configs'] / m['matrix_wall_s']:.1f} "
            f"configurations/s, pool start included; {m['broken']} broken)",
            *_render_groups(m),
            f"one spawn per config:      {m['spawn_per_config_s']:7.2f} s each (mean of {m['spawn_sample']}), "
            f"{extrapolated:.0f} s for the matrix",
            "-" * 72,
            f"ratio spawn per configuration / warm pool: {m['ratio_spawn_per_warm']:.0f}x",
            *(f"(spawn failed, left out of the mean: {failure})" for failure in m["spawn_failures"]),
            *_render_recipes(m.get("by_recipe")),
            *_render_loop(m.get("loop_rows")),
            *_render_user(m.get("user_workload")),
            *_render_localization(m.get("localization")),
        ]
    )


def _render_groups(m: dict[str, object]) -> list[str]:
    if "one_group_wall_s" not in m:  # a bench.json written before the lanes
        return []
    return [
        f"  on {m['jobs']} groups of ranks at once (make parity); on one group (--jobs 1): "
        f"{m['one_group_wall_s']:.1f} s, {m['ratio_one_group_per_jobs']:.2f}x"
    ]


def _render_recipes(found: object) -> list[str]:
    if not isinstance(found, dict) or not found:  # a bench.json written before the recipes
        return []
    total = sum(entry["time_s"] for entry in found.values()) or 1.0
    lines = ["", "the matrix's rows by precision recipe (time in the rows; reference runs shared)"]
    for name, entry in sorted(found.items(), key=lambda item: -item[1]["time_s"]):
        each = entry["time_s"] / entry["configs"] * 1e3
        lines.append(
            f"  {name:<14} {entry['configs']:4d} rows {entry['time_s']:6.1f} s "
            f"({each:4.0f} ms each, {entry['time_s'] / total:4.0%} of the matrix)"
        )
    return lines


def _render_user(u: object) -> list[str]:
    if not isinstance(u, dict):  # a bench.json written before the user-workload measure
        return []
    return [
        "",
        f"user workload {u['workload']!r}, its whole matrix: {u['tool_wall_s']:7.1f} s for {u['configs']} "
        f"configurations ({u['steps']} steps trained on {u.get('jobs', 1)} group(s) of ranks, pool start "
        "included)",
        f"the same {u['steps']} steps in a plain loop:   {u['plain_loop_s']:7.1f} s (one process, no wrapper, "
        "scaler or recording)",
        f"ratio tool / plain loop: {u['ratio_tool_per_plain']:.1f}x",
    ]


def _render_localization(found: object) -> list[str]:
    if not isinstance(found, dict):
        return []
    if "error" in found:
        return [f"localization: not measured: {found['error']}"]
    return [
        f"localization (failing configurations only; {found['failing_configs']} planted bugs): "
        f"+{found['per_failing_config_s'] * 1e3:.0f} ms per failing configuration "
        f"({found['judge_s'] * 1e3:.0f} ms judged alone, {found['judge_and_localize_s'] * 1e3:.0f} ms localized; "
        f"re-runs on the ranks {found['ranks_rerun_s'] * 1e3:.0f} ms); a passing matrix pays nothing"
    ]


def main() -> int:
    print(render(measure()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
