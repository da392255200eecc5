"""What a parity check costs as the model grows, against the training it checks (issue 25, item 2).

One FSDP2 fp32 configuration (``reshard_after_forward=True``, SGD, ``STEPS`` steps, 2 gloo ranks) of
a Hugging Face ``LlamaForCausalLM`` at about 1M, 10M and 50M parameters (``SIZES``; the 50M point
only on request, ``python -m ci.bench --cost-sizes 1M,10M,50M``: minutes on 2 cores), against the
same training without the tool: a plain DDP loop and a plain FSDP2 loop (the reference's and the
candidate's steps) on the same ranks, with no scaler, no recording, no gather, no comparison.

Each side runs in a subprocess of its own (``python -m ci.bench.cost_curve SIDE SIZE``) on a fresh
:class:`~harness.controller.pool.RankPool`, so peak memory is that side's alone: the sum of every
rank's peak resident set (``VmHWM``, read just before the pool closes) plus the controller's. The
time is the case's wall time on the warm pool (the pool's start, the same for both, is left out).
Ratios are tool / plain, measured in the same run. Timing is information, never a verdict.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from harness.parity.plan.config import Layout

SIZES: dict[str, tuple[int, int, int]] = {
    "1M": (128, 2, 1024),
    "10M": (384, 4, 4096),
    "50M": (768, 6, 8192),
}
"""Size -> (hidden, layers, vocabulary); untied head, intermediate 8/3 of hidden (as the issue's
0.7M, 10.2M and 55.1M models)."""
DEFAULT_SIZES = ("1M", "10M")
STEPS = 6
BATCH, SEQ = 4, 64
_SIDE_TIMEOUT_S = 1800


def _llama(size: str) -> Any:
    import torch
    import transformers

    from harness.parity import Workload

    hidden, layers, vocab = SIZES[size]
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=-(-hidden * 8 // 3 // 8) * 8,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        max_position_embeddings=SEQ,
        tie_word_embeddings=False,
    )
    return Workload(
        name=f"llama_{size}",
        model=lambda: transformers.LlamaForCausalLM(config),
        batch=lambda rank, step: torch.randint(0, vocab, (BATCH, SEQ)),
        loss=lambda model, ids: model(input_ids=ids, labels=ids).loss,
        units="auto",
    )


def llama_1M() -> Any:  # noqa: N802 - the size is the name
    return _llama("1M")


def llama_10M() -> Any:  # noqa: N802
    return _llama("10M")


def llama_50M() -> Any:  # noqa: N802
    return _llama("50M")


def parallelize_llama(model: Any, mesh: Any) -> Any:
    """The user's function the ``function`` rows check: activation checkpointing and
    ``fully_shard`` per decoder layer in bf16 with a float32 reduce, then the root (torchtitan's
    shape, without compiling: compile time would dominate either side)."""
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    layers = model.model.layers
    for index, layer in enumerate(layers):
        layers[index] = fully_shard(checkpoint_wrapper(layer), mesh=mesh, mp_policy=policy)
    return fully_shard(model, mesh=mesh, mp_policy=policy)


def _function(size: str) -> Any:
    import dataclasses

    import torch

    return dataclasses.replace(
        _llama(size),
        name=f"llama_fn_{size}",
        units=(),
        parallelize=parallelize_llama,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3, foreach=True),
    )


def llama_fn_1M() -> Any:  # noqa: N802
    return _function("1M")


def llama_fn_10M() -> Any:  # noqa: N802
    return _function("10M")


def llama_fn_50M() -> Any:  # noqa: N802
    return _function("50M")


def spec(size: str, function: bool = False) -> str:
    """The workload spec of ``size`` (``ci.bench.cost_curve:llama_10M``; ``function``: the one
    parallelized by the user's :func:`parallelize_llama`)."""
    return f"{__name__}:llama_{'fn_' if function else ''}{size}"


# -- rank side: the plain loops -------------------------------------------------------------------
def warm(workload_spec: str) -> None:
    """Warms the pool before anything is timed: ranks started, group built, ``transformers``
    imported and the workload resolved (seconds, the same for both sides)."""
    from harness.parity.workload import registry

    registry.get(workload_spec)


def plain_loops(workload_spec: str, steps: int) -> int:
    """DDP then FSDP2 (units from the workload), ``steps`` steps each, SGD with momentum: the
    training the tool checks, with nothing of the tool. Returns the parameter count."""
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
    wrapped: list[torch.nn.Module] = [DistributedDataParallel(model)]
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


# -- one side, in its own process -----------------------------------------------------------------
def measure_side(side: str, size: str, world_size: int = 2) -> dict[str, Any]:
    """``side`` (``tool`` or ``plain``; ``tool_fn``, ``plain_fn``: the user's function) at ``size``
    on a fresh pool of ``world_size`` ranks: wall seconds and peak bytes."""
    from harness.controller.memory import rss
    from harness.controller.pool import CaseSpec, RankPool
    from harness.outcome import judge
    from harness.spec import DistConfig

    config = DistConfig(
        world_size=world_size, backend="gloo", deadline_s=_SIDE_TIMEOUT_S, collective_timeout_s=600
    )
    pool = RankPool(threads_per_rank=1)
    try:
        function = side.endswith("_fn")
        workload = spec(size, function)
        pool.run(CaseSpec(target=f"{__name__}:warm", config=config, args=(workload,)))
        started = time.perf_counter()
        if side.startswith("plain"):
            loops = "plain_function" if function else "plain_loops"
            case = CaseSpec(target=f"{__name__}:{loops}", config=config, args=(workload, STEPS))
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
    return {
        "side": side,
        "size": size,
        "status": status,
        "detail": detail,
        "wall_s": wall,
        "ranks_peak_bytes": ranks,
        "controller_peak_bytes": own[0] if own is not None else 0,
        "peak_bytes": sum(ranks) + (own[0] if own is not None else 0),
    }


def _side(side: str, size: str, world_size: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", __name__, side, size, str(world_size)],
        capture_output=True,
        text=True,
        timeout=_SIDE_TIMEOUT_S,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        return {"side": side, "size": size, "error": f"exit {done.returncode}: {tail}"}
    return json.loads(lines[-1])


def measure(sizes: tuple[str, ...] = DEFAULT_SIZES, world_size: int = 2) -> dict[str, Any]:
    """Both sides at every size on ``world_size`` gloo ranks, for the built-in FSDP2 row and for a
    user's function's row (``function``: :func:`parallelize_llama` against a plain run of that
    function); the ratios tool / plain of time and of peak memory."""
    rows = []
    for size, function in [(size, function) for function in (False, True) for size in sizes]:
        suffix = "_fn" if function else ""
        plain, tool = _side("plain" + suffix, size, world_size), _side("tool" + suffix, size, world_size)
        row: dict[str, Any] = {"size": size, "steps": STEPS, "plain": plain, "tool": tool}
        row["function"] = function
        if all("error" not in side and side.get("status") == "pass" for side in (plain, tool)):
            row["time_ratio"] = tool["wall_s"] / plain["wall_s"]
            row["memory_ratio"] = tool["peak_bytes"] / plain["peak_bytes"]
        rows.append(row)
    return {
        "model": "HF LlamaForCausalLM",
        "configuration": f"fsdp2 fp32, {world_size} gloo ranks",
        "rows": rows,
    }


def render(m: dict[str, Any]) -> str:
    """The curve as a table; a side that failed shows its error."""
    gb = 1024**3
    lines = [
        f"cost curve: {m['model']}, one {m['configuration']} configuration against plain DDP + FSDP2 loops",
        "-" * 96,
        f"{'size':>5} {'plain s':>9} {'tool s':>9} {'time x':>7} {'plain GB':>9} {'tool GB':>9} {'mem x':>7}  tool",
    ]
    for row in m["rows"]:
        plain, tool = row["plain"], row["tool"]
        if row.get("function") and not any(r.get("function") for r in m["rows"][: m["rows"].index(row)]):
            lines.append(
                "a user's parallelize function (AC + fully_shard per layer, bf16/fp32 reduce, AdamW):"
            )
        if "time_ratio" not in row:
            broken = next(side for side in (plain, tool) if "error" in side or side.get("status") != "pass")
            why = broken.get("error") or f"{broken['status']}: {broken['detail']}"
            lines.append(f"{row['size']:>5} not measured: the {broken['side']} side {why}")
            continue
        lines.append(
            f"{row['size']:>5} {plain['wall_s']:9.1f} {tool['wall_s']:9.1f} {row['time_ratio']:6.1f}x "
            f"{plain['peak_bytes'] / gb:9.2f} {tool['peak_bytes'] / gb:9.2f} {row['memory_ratio']:6.1f}x  "
            f"{tool['status']}"
        )
    lines.append(
        "memory: every rank's peak resident set plus the controller's; time: warm pool, start excluded"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    print(json.dumps(measure_side(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 2)))
