"""A resume row that comes back at another world size (rank side): what each half leaves the other.

Why two halves: the warm rank pool runs one world size at a time, so a row saved at world size W
and loaded at W' runs as two rank calls (``doors/reshard.py``): the first at W trains steps
``0 .. resume_at - 1`` and saves, the second at W' builds everything afresh, loads and trains the
rest. The folder between them is made by the controller and seen by every rank of both calls.

What crosses, beside the checkpoint the row's method writes (``resume_store.py``):

* **The reference's state** (:func:`hand_over`, :func:`take_over`): the reference is the
  candidate's unsharded twin, so it changes world size where its candidate does: from
  ``resume_at`` on it is the twin at W' (its reduce layout and divide factors), continuing from
  exactly the state the twin at W reached. It is replicated, so rank 0 writes its parameters,
  buffers, optimizer and scaler whole (``torch.save``: exact, not the code under test); each rank
  writes its own carried RNG and schedulers.
* **The data**: batches are drawn per ``(rank, step)`` on both sides, so rank r of either world
  size sees the same batch at the same step; the global batch is the per-rank batch times the
  world size, before the resume and after it, on both sides alike.
* **The loop's state at another world size** (:func:`loop_file`): a rank that the saving world
  had reads its own file (its RNG); a rank it did not have reads rank 0's (the data position and
  the schedulers, the same on every rank) and starts its RNG as the rule in ``resume.py`` says,
  on both sides.
* **The audit** (:func:`save_audit`, :func:`whole_audit`): the shards differ between the world
  sizes, so the candidate's weights and optimizer state are compared whole, gathered before the
  save and after the load; values found in other places are a misplaced shard.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
import torch.distributed as dist

from harness.parity.ranks.sides import engines
from harness.parity.ranks.sides.loop_state import LoopState


@dataclasses.dataclass(frozen=True, slots=True)
class Half:
    """Which half of a resharded row a rank call runs, and where the halves meet."""

    part: int
    """1: train up to ``resume_at`` and save; 2: load and train the rest."""
    folder: str
    """The folder the controller made, seen by every rank of both halves."""
    saved_world_size: int
    """The world size of the first half (the row's ``world_size``)."""

    def __post_init__(self) -> None:
        if self.part not in (1, 2):
            raise ValueError(f"Half.part must be 1 or 2, got {self.part!r}")


_REFERENCE = "reference.pt"
_AUDIT = "audit.pt"


def _rank_file(folder: str, stem: str, rank: int) -> str:
    return os.path.join(folder, f"{stem}_rank{rank}.pt")


def hand_over(
    folder: str, engine: engines.Engine, optimizer: torch.optim.Optimizer, scaler: Any, loop: LoopState
) -> None:
    """The reference's state at the end of the first half: whole (rank 0) and per rank."""
    rank = dist.get_rank()
    if rank == 0:
        whole = {
            "params": {n: p.detach().clone() for n, p in engine.named_trainable()},
            "buffers": {n: b.detach().clone() for n, b in engine.trained_module().named_buffers()},
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict(),
        }
        torch.save(whole, os.path.join(folder, _REFERENCE))
    own = {
        "rng": loop.rng.state if loop.rng is not None else [],
        "schedulers": [s.state_dict() for s in loop.schedulers],
    }
    torch.save(own, _rank_file(folder, "reference", rank))


def take_over(
    folder: str,
    engine: engines.Engine,
    optimizer: torch.optim.Optimizer,
    scaler: Any,
    saved_world_size: int,
) -> dict[str, Any]:
    """Load what :func:`hand_over` wrote into a fresh reference at this world size; returns this
    rank's loop state (``rng`` is ``None`` for a rank the first half did not have)."""
    whole = torch.load(os.path.join(folder, _REFERENCE), weights_only=False)
    params = dict(engine.named_trainable())
    if set(params) != set(whole["params"]):
        raise RuntimeError(
            f"the reference handed over parameters {sorted(whole['params'])}, this one trains {sorted(params)}"
        )
    with torch.no_grad():
        for name, value in whole["params"].items():
            params[name].copy_(value)
        buffers = dict(engine.trained_module().named_buffers())
        for name, value in whole["buffers"].items():
            buffers[name].copy_(value)
    optimizer.load_state_dict(whole["optimizer"])
    scaler.load_state_dict(whole["scaler"])
    own_rank, kept = loop_file(dist.get_rank(), saved_world_size)
    own = torch.load(_rank_file(folder, "reference", own_rank), weights_only=False)
    return {"rng": own["rng"] if kept else None, "schedulers": own["schedulers"]}


def loop_file(rank: int, saved_world_size: int) -> tuple[int, bool]:
    """``(whose file rank reads, whether its RNG is this rank's own)``: its own where the saving
    world had it, else rank 0's (whose data position and schedulers every rank shares)."""
    if rank < saved_world_size:
        return rank, True
    return 0, False


def save_audit(
    folder: str, engine: engines.Engine, optimizer: torch.optim.Optimizer, saved: dict[str, Any]
) -> None:
    """What the second half's audit compares with: whole weights and optimizer state (a
    collective on every rank), the scaler and the schedulers (rank 0 writes)."""
    params, state = engine.full_after_step([optimizer])
    if dist.get_rank() == 0:
        audit = {
            "params": params,
            "state": state,
            "scaler": saved["scaler"],
            "schedulers": saved["schedulers"],
        }
        torch.save(audit, os.path.join(folder, _AUDIT))


def read_audit(folder: str) -> dict[str, Any]:
    """What :func:`save_audit` wrote."""
    return torch.load(os.path.join(folder, _AUDIT), weights_only=False)


def whole_audit(
    saved: dict[str, Any], params: dict[str, torch.Tensor], state: dict[str, dict[str, torch.Tensor]]
) -> dict[str, list[str]]:
    """Whole tensors that differ after the load, by group: ``misplaced`` (exactly the saved
    values, in other places: a shard loaded into the wrong rank or rows), ``weights``,
    ``optimizer`` (moments) and ``optimizer_step`` (step counts)."""
    found: dict[str, list[str]] = {"weights": [], "misplaced": [], "optimizer": [], "optimizer_step": []}
    for name, value in saved["params"].items():
        where = _where_differs(value, params.get(name))
        if where is not None:
            found["misplaced" if where else "weights"].append(name)
    for name, values in saved["state"].items():
        for key, value in values.items():
            where = _where_differs(value, state.get(name, {}).get(key))
            if where is not None:
                group = "misplaced" if where else ("optimizer_step" if key == "step" else "optimizer")
                found[group].append(f"{name}:{key}")
    return {group: names for group, names in found.items() if names}


def _where_differs(saved: Any, now: Any) -> bool | None:
    """``None``: equal; ``True``: the same values in other places; ``False``: other values."""
    if isinstance(saved, torch.Tensor) and isinstance(now, torch.Tensor):
        if saved.shape == now.shape and torch.equal(saved, now):
            return None
        return saved.numel() > 1 and torch.equal(saved.flatten().sort().values, now.flatten().sort().values)
    return None if saved == now else False
