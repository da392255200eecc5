"""How a resume row writes and reads its checkpoint (rank side): one class per method.

Why each through the API users use for it: a resume row checks that a run which stopped and came
back trains exactly like one that did not, so the checkpoint must go through the code a user's
3 a.m. restart runs, not through a shortcut of ours:

* :class:`DistributedCheckpoint` (``dcp``): ``torch.distributed.checkpoint``'s ``get_state_dict``
  / ``set_state_dict`` for the model and optimizer (sharded: each rank writes its own shards into
  one folder), the scaler's ``state_dict`` beside them in the same ``dcp.save``.
* :class:`NameKeyedOptimizer` (``sharded_optimizer``): the model through DCP as above, the
  optimizer through ``scaler.ShardedOptimizer``'s name-keyed ``state_dict``/``load_state_dict``
  (DCP for DTensor state, which it can reshard; one file per rank for FSDP1's flat shards, which
  DCP would take for replicated tensors).
* :class:`UserFunctions` (``user``): the workload's own ``save(folder, model, optimizer, scaler)``
  and ``load(...)``, called on every rank.

Each method's ``save`` and ``load`` take the same arguments on every rank and run the same
collectives there: a rank never decides alone whether to call one.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, create_default_local_load_plan
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from harness.parity.ranks.sides.full import gather
from harness.parity.workload import registry


class CurrentFormatLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner without its guess that a checkpoint is older than torch 2.4.

    Why: torch 2.13's ``DefaultLoadPlanner.create_local_plan`` treats any key of the checkpoint
    that this rank's state lacks as the sign of a checkpoint written by torch <= 2.3, and then
    re-flattens the state the old way (lists kept whole: ``optim.param_groups``, ``scaler``),
    whose keys the checkpoint does not have. But a rank legitimately lacks keys: FSDP1's sharded
    state dict chunks each parameter on dim 0 over the ranks, so at world size 8 a ``Linear(32, 4)``
    head's 4 rows leave ranks 4 to 7 with a ``ShardedTensor`` of no local shard, which
    ``_flatten_sharded_tensors`` drops. Those ranks then failed the load with "Missing key in
    checkpoint state_dict: optim.param_groups" (``scaler`` under the name-keyed method). Our
    checkpoints are written by the running torch, so the plan is made from the current flattening,
    exactly as the default planner makes it for a rank that holds a row of every tensor; a key
    that is really missing still raises.
    """

    def create_local_plan(self) -> Any:
        assert self.metadata is not None, "set_up_planner runs first"
        return create_default_local_load_plan(self.state_dict, self.metadata, not self.allow_partial_load)


class DistributedCheckpoint:
    """``dcp``: model and optimizer through ``get_state_dict``/``set_state_dict``, scaler beside."""

    name = "torch.distributed.checkpoint (get_state_dict/set_state_dict)"

    def save(
        self, folder: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: Any
    ) -> None:
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save(
            {"model": model_state, "optim": optim_state, "scaler": scaler.state_dict()}, checkpoint_id=folder
        )

    def load(
        self, folder: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: Any
    ) -> None:
        # get_state_dict creates the optimizer's state (one step at lr 0 on zero gradients): DCP
        # loads in place, into tensors that must exist. The load then replaces all of it.
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state, "scaler": scaler.state_dict()}
        dcp.load(state, checkpoint_id=folder, planner=CurrentFormatLoadPlanner())
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        scaler.load_state_dict(state["scaler"])


def _is_dtensor(value: Any) -> bool:
    return hasattr(value, "to_local") and hasattr(value, "device_mesh")


def _named(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The optimizer's parameters by the model's names (one optimizer over all trainable ones)."""
    owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
    return {name: p for name, p in model.named_parameters() if id(p) in owned}


class NameKeyedOptimizer:
    """``sharded_optimizer``: the optimizer's state through ``scaler.ShardedOptimizer``.

    The candidate trains with the plain optimizer the matrix names (so its verdict is the plain
    rows'); at a save its state moves into a ``ShardedOptimizer`` over the same parameters, whose
    name-keyed ``state_dict`` is written; at a load a fresh ``ShardedOptimizer`` creates its state
    (``initialize_state``), reads the checkpoint into it (``load_state_dict``), and the state moves
    back into the fresh plain optimizer. What goes through the checkpoint is the name-keyed form.
    """

    name = "scaler.ShardedOptimizer name-keyed state_dict (model through DCP)"

    def save(
        self, folder: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: Any
    ) -> None:
        named = _named(model, optimizer)
        sharded = self._wrapper(named, optimizer)
        for param, local in zip(named.values(), self._locals(sharded), strict=True):
            sharded.local_optimizer.state[local] = {
                key: value.to_local() if _is_dtensor(value) else value
                for key, value in optimizer.state.get(param, {}).items()
            }
        for mine, theirs in zip(sharded.param_groups, optimizer.param_groups, strict=True):
            mine.update({k: v for k, v in theirs.items() if k not in ("params", "param_names")})
        state = {"model": get_model_state_dict(model), "scaler": scaler.state_dict()}
        if self._dtensors(named):
            state["optim"] = sharded.state_dict()
        else:
            torch.save(sharded.state_dict(), self._own_file(folder))
        dcp.save(state, checkpoint_id=folder)

    def load(
        self, folder: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: Any
    ) -> None:
        named = _named(model, optimizer)
        sharded = self._wrapper(named, optimizer)
        sharded.initialize_state()
        state: dict[str, Any] = {"model": get_model_state_dict(model), "scaler": scaler.state_dict()}
        if self._dtensors(named):
            state["optim"] = sharded.state_dict()
        dcp.load(state, checkpoint_id=folder, planner=CurrentFormatLoadPlanner())
        optim_state = state["optim"] if self._dtensors(named) else torch.load(self._own_file(folder))
        sharded.load_state_dict(optim_state)
        set_model_state_dict(model, state["model"])
        for param, local in zip(named.values(), self._locals(sharded), strict=True):
            optimizer.state[param] = {
                key: self._like(value, param) for key, value in sharded.local_optimizer.state[local].items()
            }
        for mine, theirs in zip(optimizer.param_groups, sharded.param_groups, strict=True):
            mine.update({k: v for k, v in theirs.items() if k not in ("params", "param_names")})
        scaler.load_state_dict(state["scaler"])

    @staticmethod
    def _wrapper(named: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer) -> Any:
        from scaler import ShardedOptimizer

        sharded = ShardedOptimizer(named, type(optimizer), **optimizer.defaults)
        # The wrapper links DTensor gradients to its local tensors with hooks; it lives only for
        # this save or load, so its hooks must not outlive it on the parameters.
        for handle in sharded._grad_hooks:
            handle.remove()
        return sharded

    @staticmethod
    def _locals(sharded: Any) -> list[torch.Tensor]:
        """The wrapper's local tensors, one per parameter in the order it was given them."""
        return [p for group in sharded.local_optimizer.param_groups for p in group["params"]]

    @staticmethod
    def _like(value: Any, param: torch.Tensor) -> Any:
        """A local state tensor as the plain optimizer holds it: a DTensor like its parameter."""
        if not (_is_dtensor(param) and isinstance(value, torch.Tensor) and value.dim() > 0):
            return value
        return gather.shard_like(value, param)

    @staticmethod
    def _dtensors(named: dict[str, torch.Tensor]) -> bool:
        """Whether the parameters are DTensors (FSDP2): the same answer on every rank."""
        return any(_is_dtensor(p) for p in named.values())

    @staticmethod
    def _own_file(folder: str) -> str:
        return os.path.join(folder, f"sharded_optimizer_rank{dist.get_rank()}.pt")


class UserFunctions:
    """``user``: the workload's ``save``/``load``, called as ``f(folder, model, optimizer, scaler)``."""

    def __init__(self, workload: str) -> None:
        found = registry.get(workload)
        assert found.save is not None and found.load is not None, "checked by ParityConfig"
        self.workload = found.name
        self.save, self.load = found.save, found.load
        self.name = f"workload {found.name!r}'s own save/load"

    def function(self, phase: str) -> str:
        """``workload 'x''s save (my_checkpoints.save)``: the function a phase calls."""
        func = self.save if phase == "save" else self.load
        where = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"
        return f"workload {self.workload!r}'s {phase}(folder, model, optimizer, scaler) ({where})"


def function(store: Any, phase: str) -> str:
    """What a phase (``save``, ``load``) of ``store`` calls, in words for an error."""
    if hasattr(store, "function"):
        return store.function(phase)
    return f"{store.name}, {phase}"


def method(config_method: str, workload: str) -> Any:
    """The store of ``config_method`` (``plan/config/resume.METHODS``)."""
    if config_method == "dcp":
        return DistributedCheckpoint()
    if config_method == "sharded_optimizer":
        return NameKeyedOptimizer()
    if config_method == "user":
        return UserFunctions(workload)
    raise ValueError(f"resume_method must be 'dcp', 'sharded_optimizer' or 'user', got {config_method!r}")
