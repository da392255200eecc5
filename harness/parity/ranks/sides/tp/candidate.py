"""FSDP2 with tensor parallelism as the candidate (rank side): torchtitan's 2-D recipe.

Why its own module: the candidate is torch's own ``parallelize_module`` then ``fully_shard`` over
the ``dp`` dimension, and all it adds is what the localization needs to read a TP rank's
activations whole (:meth:`FSDP2TP.observed`). Its twin's arithmetic, which is where tensor
parallelism changes values, is ``mirror.py``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from harness.parity.ranks.sides.engines import FSDP2, unit_modules
from harness.parity.ranks.sides.full import gather
from harness.parity.ranks.sides.tp.mirror import is_colwise, is_sequence
from harness.parity.workload import tp_plan


class FSDP2TP(FSDP2):
    """``parallelize_module(model, mesh["tp"], plan)``, then ``fully_shard(mesh=mesh["dp"])`` on every
    unit and the root: torchtitan's 2-D recipe on a ``dp x tp`` mesh."""

    def __init__(self, config: Any, device: torch.device) -> None:
        super().__init__(config, device)
        self.description = (
            f"FSDP2 + TP (mesh dp {self.world_size // config.mesh.tp} x tp {config.mesh.tp}), "
            f"reshard_after_forward={config.layout.reshard_after_forward}, {config.recipe_name}; "
            f"plan: {self.plan_text}"
        )

    def wrap(self, module: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import parallelize_module

        config = self.config
        shape, names = config.mesh.shape(config.world_size)  # type: ignore[misc]
        mesh = gather.mesh(self.device.type, shape, names)
        plan = self.plan(module)
        tp_plan.check_degree(self.workload, module, config.mesh.tp)
        self.plan_text = ", ".join(f"{key} {type(style).__name__}" for key, style in plan.items())
        parallelize_module(module, mesh["tp"], plan)
        self.tp_group = mesh["tp"].get_group()
        styled = tp_plan.styled_modules(plan, module)
        self.column_outputs = {name for name, style in styled if is_colwise(style)}
        """The modules whose outputs (and their gradients) are a TP rank's share of the last dim."""
        self.sequence_dim = next((s.sequence_sharding[0].dim for _, s in styled if is_sequence(s)), None)
        """Under a sequence-parallel plan, the dim along which activations between blocks are shared."""
        kwargs: dict[str, Any] = {
            "mesh": mesh["dp"],
            "reshard_after_forward": config.layout.reshard_after_forward,
        }
        if config.policy is not None:
            from harness.parity.ranks.sides import twin

            kwargs["mp_policy"] = twin.fsdp2_mixed_precision(config.policy)
        for unit in reversed(unit_modules(module, self.units)):  # innermost first
            fully_shard(unit, **kwargs)
        fully_shard(module, **kwargs)
        return module

    def observed(self, module: str, tensor: torch.Tensor) -> torch.Tensor:
        """An activation (or its gradient) whole: a plain tensor the TP ranks hold differently is
        each rank's share, gathered over the TP group along the last dim (a ``ColwiseParallel``
        output) or the sequence dim (between the blocks of a sequence-parallel plan); one the ranks
        hold alike is whole already; a DTensor is gathered by the probe; shares of unequal shapes
        (an uneven split) stay as they are. Collective: every TP rank probes the same modules in
        the same order, and every branch is taken on data the TP group gathered, so alike."""
        import torch.distributed as dist

        if hasattr(tensor, "full_tensor"):
            return tensor
        ranks = dist.get_world_size(self.tp_group)
        shape = torch.tensor(tensor.shape, dtype=torch.int64)
        shapes = [torch.empty_like(shape) for _ in range(ranks)]
        dist.all_gather(shapes, shape, group=self.tp_group)  # uneven shares: left as they are
        if any(not torch.equal(shapes[0], other) for other in shapes[1:]):
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(ranks)]
        dist.all_gather(parts, tensor.detach().contiguous(), group=self.tp_group)
        if all(torch.equal(parts[0], part) for part in parts[1:]):
            return tensor
        dim = -1 if module in self.column_outputs else self.sequence_dim
        return tensor if dim is None else torch.cat(parts, dim)

    def plan(self, module: nn.Module) -> dict[str, Any]:
        """The workload's plan over ``module`` (``"auto"`` read from it), checked against its names."""
        return tp_plan.resolve(self.workload, module)
