"""A run's state as a resume checks it (rank side): the fresh model's new weights, and what the
audits compare (a resume row's carried forward RNG lives with the schedulers: ``sides/loop_state.py``).

Why apart from ``resume.py``: the restart (save, drop, build afresh, load) is one job; what state a
run holds and how two snapshots of it differ is another, which both the same-world-size restart
and a resharded row's halves (``reshard.py``) use.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.parity.ranks.sides import engines
from harness.parity.ranks.sides.loop_state import LoopState


def scramble(engine: engines.Engine, seed: int) -> None:
    """New random values in every local parameter (DDP: the same on every rank, as a fresh
    replicated model's; sharded engines: each rank its own shard)."""
    rank = 0 if engine.config.engine == "ddp" else engine.rank
    generator = torch.Generator().manual_seed(seed * 1_000_003 + rank)
    with torch.no_grad():
        for _, param in engine.named_trainable():
            local = engine.local(param)
            local.copy_(torch.randn(local.shape, generator=generator, dtype=torch.float32).to(local.dtype))


def _local_state(
    engine: engines.Engine, optimizer: torch.optim.Optimizer
) -> dict[str, dict[str, torch.Tensor]]:
    named = {id(p): n for n, p in engine.named_trainable()}
    return {
        named[id(p)]: {
            k: engine.local(v).detach().clone() for k, v in values.items() if isinstance(v, torch.Tensor)
        }
        for p, values in optimizer.state.items()
        if id(p) in named
    }


def snapshot(
    engine: engines.Engine, optimizer: torch.optim.Optimizer, scaler: Any, loop: LoopState
) -> dict[str, Any]:
    """This rank's state, local shards cloned, as the audit compares it."""
    return {
        "weights": {n: engine.local(p).detach().clone() for n, p in engine.named_trainable()},
        "optimizer": _local_state(engine, optimizer),
        "scaler": (float(scaler.get_scale()), int(scaler._get_growth_tracker())),
        "rng": [s.clone() for s in loop.rng.state] if loop.rng is not None else [],
        "schedulers": [s.state_dict() for s in loop.schedulers],
    }


def audit(saved: dict[str, Any], now: dict[str, Any]) -> dict[str, list[str]]:
    """Which state differs between two :func:`snapshot`\\ s, by group: ``weights`` and
    ``optimizer`` (moments) and ``optimizer_step`` by name, ``scaler``, ``rng``, ``schedulers``."""
    found: dict[str, list[str]] = {}

    def differs(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
        return a is None or b is None or a.shape != b.shape or not torch.equal(a, b)

    found["weights"] = [n for n, v in saved["weights"].items() if differs(v, now["weights"].get(n))]
    moments, steps = [], []
    for name, values in saved["optimizer"].items():
        mine = now["optimizer"].get(name, {})
        for key, value in values.items():
            if differs(value, mine.get(key)):
                (steps if key == "step" else moments).append(f"{name}:{key}")
    found["optimizer"], found["optimizer_step"] = moments, steps
    if saved["scaler"] != now["scaler"]:
        (scale, tracker), (was, was_tracker) = now["scaler"], saved["scaler"]
        found["scaler"] = [f"scale {scale:g} (saved {was:g}), growth tracker {tracker} (saved {was_tracker})"]
    if len(saved["rng"]) != len(now["rng"]) or any(
        not torch.equal(a, b) for a, b in zip(saved["rng"], now["rng"], strict=False)
    ):
        found["rng"] = ["torch's RNG state"]
    schedulers = [
        f"scheduler {i}: last_epoch {b.get('last_epoch')} (saved {a.get('last_epoch')})"
        for i, (a, b) in enumerate(zip(saved["schedulers"], now["schedulers"], strict=True))
        if a != b
    ]
    if schedulers:
        found["schedulers"] = schedulers
    return {group: names for group, names in found.items() if names}


def moved(saved: dict[str, torch.Tensor], now: dict[str, torch.Tensor]) -> dict[str, list[str]]:
    """Whole weights that differ after a load into another layout: ``misplaced`` when a
    tensor holds exactly the saved values in other places (a shard loaded into the wrong rank or
    rows), ``weights`` otherwise."""
    found: dict[str, list[str]] = {"weights": [], "misplaced": []}
    for name, value in saved.items():
        mine = now.get(name)
        if mine is not None and mine.shape == value.shape and torch.equal(mine, value):
            continue
        same_values = mine is not None and torch.equal(
            mine.flatten().sort().values, value.flatten().sort().values
        )
        found["misplaced" if same_values else "weights"].append(name)
    return {group: names for group, names in found.items() if names}
