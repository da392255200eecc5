"""The user's own parallelization as the candidate (rank side): their function, called unchanged.

Why a candidate of its own: the built-in engines wrap the model the way the matrix names; this one
hands a fresh model and a ``DeviceMesh`` to the workload's ``parallelize`` function and trains
whatever it returns, exactly as the user's script would. What it did is read off the result
(``discover.read``) for the description, the report and the twin; the candidate itself trusts
nothing of it. Gathering full tensors works for any mix the function may return (DTensors of
``fully_shard`` and of tensor parallelism, plain tensors under DDP): FSDP2's gather is the one
that handles all three.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from harness.parity.plan.config import ParityConfig
from harness.parity.plan.precision import PrecisionPolicy
from harness.parity.ranks.sides import compiled as compiling
from harness.parity.ranks.sides.engines import Engine
from harness.parity.ranks.sides.full import gather
from harness.parity.ranks.sides.tp.candidate import FSDP2TP
from harness.parity.ranks.sides.tp.mirror import is_colwise, is_sequence
from harness.parity.ranks.sides.user import discover, policies
from harness.parity.ranks.sides.user.found import READ_FROM_TORCH, Found
from harness.parity.ranks.wire import FunctionFacts
from harness.torch_private import tensor_parallel


def user_mesh(config: ParityConfig, device: torch.device) -> Any:
    """The ``DeviceMesh`` the function receives: the configuration's dimensions, names and sizes
    as the user gave them (kept for the process group: the twin's reductions use its groups)."""
    dims = config.mesh.dims or ()  # always set for engine 'user' (``Mesh.check_dims``)
    return gather.mesh(device.type, tuple(size for _, size in dims), tuple(name for name, _ in dims))


def run_function(config: ParityConfig, module: nn.Module, device: torch.device) -> tuple[nn.Module, Found]:
    """The workload's ``parallelize`` applied to ``module``, and what it did. Collective as the
    function is (``fully_shard`` and DDP build process groups and broadcast): every rank calls it."""
    from harness.parity.workload import registry

    workload = registry.get(config.workload)
    styles: list[tuple[nn.Module, Any, Any]] = []
    ties = discover.ties_of(module)
    with tensor_parallel.recording_styles(styles):
        result = workload.parallelize(module, user_mesh(config, device))  # type: ignore[misc]
    if not isinstance(result, nn.Module):
        raise TypeError(
            f"workload {workload.name!r}: parallelize returned {type(result).__name__}, not the model; "
            "end the function with `return model` (fully_shard works in place and returns it too)"
        )
    return result, discover.read(result, styles, config.mesh.data_parallel_size(config.world_size), ties)


class UserParallel(FSDP2TP):
    """The model as the user's ``parallelize`` function returns it."""

    def __init__(self, config: ParityConfig, device: torch.device) -> None:
        Engine.__init__(self, config, device)  # FSDP2's and FSDP2TP's own wrapping skipped
        name = getattr(self.workload.parallelize, "__qualname__", "parallelize")
        self.description = (
            f"your {name}() on mesh {config.mesh.words()}: {self.found.summary()}{READ_FROM_TORCH}"
            + "; ".join(self.found.lines())
        )
        if self.found.checkpointed:
            replayed = all(replay for _, replay in self.found.checkpointed)
            self.recorded_checkpoint = "replay" if replayed else "no_replay"
        if self.found.compiled:
            self.compile_backend = self.found.compiled[0].backend_name
            self.compiled_count = len(self.found.compiled)
        if self.found.never_reduced or self.found.split_ties:
            self.facts = FunctionFacts(
                never_reduced=self.found.never_reduced, split_ties=self.found.split_ties
            )
        owner = policies.unit_of(self.found)
        self.units_reduce_dtypes = {
            name: policies.reduce_dtype(owner.get(name)) for name, _ in self.named_trainable()
        }

    def running_policy(self) -> PrecisionPolicy | None:
        """The units' policy (the first unit's: accumulation over units in different policies is
        refused by the twin, ``reference.the_policy``)."""
        return next((p for p in self.found.policies() if p is not None), None)

    def staged_refusal(self) -> str | None:
        if self.found.ddp is not None:
            return "the staged check does not judge a function that wraps the root in DDP (its reducer runs in C++)"
        if self.found.tp:
            return (
                "the staged check does not judge a function with a TP plan (its reference mirrors the split)"
            )
        return None

    def wrap(self, module: nn.Module) -> nn.Module:
        result, self.found = run_function(self.config, module, self.device)
        if self.found.compiled:
            compiling.settle()
        self.tp_group = None
        self.column_outputs: set[str] = set()
        self.sequence_dim = None
        if self.found.tp and self.found.tp_dim is not None:
            self.tp_group = user_mesh(self.config, self.device)[self.found.tp_dim].get_group()
            self.column_outputs = {name for name, style in self.found.tp if is_colwise(style)}
            self.sequence_dim = next(
                (s.sequence_sharding[0].dim for _, s in self.found.tp if is_sequence(s)), None
            )
        return result

    def named_trainable(self) -> list[tuple[str, torch.Tensor]]:
        return [(gather.clean_name(n), p) for n, p in self.module.named_parameters() if p.requires_grad]

    def named_parameters_whole(self) -> list[tuple[str, torch.Tensor]]:
        return [(gather.clean_name(n), p) for n, p in self.module.named_parameters()]

    def observed(self, module: str, tensor: torch.Tensor) -> torch.Tensor:
        if self.tp_group is None:
            return tensor
        return super().observed(module, tensor)
