"""FSDP2 with tensor parallelism (rank side): the candidate, and its unsharded twin's split matmuls.

Why the reference splits: tensor parallelism changes the local arithmetic. A ``RowwiseParallel``
linear computes ``x[..., part_t] @ W[:, part_t]^T`` on each TP rank and sums the ``T`` partial
products across the TP group; a ``ColwiseParallel`` one computes its share of the outputs, and the
gradient of its input is again a sum of ``T`` partial products. One unsplit matmul sums the same
products in another order, so an unsharded reference drifts from a correct candidate by rounding
from the first step. The twin therefore computes each TP'd linear as the plan splits it: the
partial products on the same shapes (contiguous, as the candidate's local shards are), summed.
With ``T = 2`` (``plan/two_d.TP_DEGREES``) the all-reduce adds two addends, which sum the same in
any order, so the verdict stays bitwise (measured: the built-in decoder and Hugging Face Llama,
fp32 and bf16, every gradient equal). Everything else of the twin is the unsharded model.

What the twin takes from the candidate: the plan (which modules, which style), and nothing else;
the shapes of the parts are derived from the weight and ``T``. So a candidate whose partial sums
are not reduced, or whose plan leaves a module out that the model's code needs split, differs.

The styles the twin mirrors: ``ColwiseParallel`` and ``RowwiseParallel`` with their default
layouts on ``nn.Linear`` (what Llama-style plans and Hugging Face's ``colwise``/``rowwise`` use);
any other style or module is refused with its name, before training.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from harness.parity.plan import two_d
from harness.parity.ranks.sides import gather
from harness.parity.ranks.sides.engines import FSDP2, unit_modules
from harness.parity.workload import tp_plan


class FSDP2TP(FSDP2):
    """``parallelize_module(model, mesh["tp"], plan)``, then ``fully_shard(mesh=mesh["dp"])`` on every
    unit and the root: torchtitan's 2-D recipe on a ``dp x tp`` mesh."""

    def __init__(self, config: Any, device: torch.device) -> None:
        super().__init__(config, device)
        self.description = (
            f"FSDP2 + TP (mesh dp {self.world_size // config.tp} x tp {config.tp}), "
            f"reshard_after_forward={config.reshard_after_forward}, {config.recipe_name}; "
            f"plan: {self.plan_text}"
        )

    def wrap(self, module: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import parallelize_module

        config = self.config
        shape, names = two_d.mesh_shape(config)  # type: ignore[misc]
        mesh = gather.mesh(self.device.type, shape, names)
        plan = self.plan(module)
        self.plan_text = ", ".join(f"{key} {type(style).__name__}" for key, style in plan.items())
        parallelize_module(module, mesh["tp"], plan)
        self.tp_group = mesh["tp"].get_group()
        self.sharded_outputs = {
            name for name, style in tp_plan.styled_modules(plan, module) if _is_colwise(style)
        }
        """The modules whose outputs (and their gradients) are a TP rank's share of the last dim."""
        kwargs: dict[str, Any] = {"mesh": mesh["dp"], "reshard_after_forward": config.reshard_after_forward}
        if config.policy is not None:
            from harness.parity.ranks.sides import twin

            kwargs["mp_policy"] = twin.fsdp2_mixed_precision(config.policy)
        for unit in reversed(unit_modules(module, self.units)):  # innermost first
            fully_shard(unit, **kwargs)
        fully_shard(module, **kwargs)
        return module

    def observed(self, module: str, tensor: torch.Tensor) -> torch.Tensor:
        """A ``ColwiseParallel`` module's output, or its gradient, gathered along the last dim over
        the TP group (collective: every TP rank probes the same modules in the same order)."""
        if module not in self.sharded_outputs:
            return tensor
        import torch.distributed as dist

        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(self.tp_group))]
        dist.all_gather(parts, tensor.detach().contiguous(), group=self.tp_group)
        return torch.cat(parts, -1)

    def plan(self, module: nn.Module) -> dict[str, Any]:
        """The workload's plan over ``module`` (``"auto"`` read from it), checked against its names."""
        return tp_plan.resolve(self.workload, module)


class _Identity(torch.autograd.Function):
    """One autograd node in front of a column-split linear: the gradient of its input is the sum of
    the parts' gradients, made here as one node's, as the candidate's TP all-reduce makes it,
    before autograd adds it to the gradients of the input's other consumers."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad


def _columns(module: nn.Linear, parts: int) -> Any:
    def forward(x: torch.Tensor) -> torch.Tensor:
        x = _Identity.apply(x)
        weights = module.weight.chunk(parts, 0)
        biases = module.bias.chunk(parts, 0) if module.bias is not None else [None] * parts
        return torch.cat([F.linear(x, w.contiguous(), b) for w, b in zip(weights, biases, strict=True)], -1)

    return forward


def _rows(module: nn.Linear, parts: int) -> Any:
    def forward(x: torch.Tensor) -> torch.Tensor:
        inputs = [piece.contiguous() for piece in x.chunk(parts, -1)]
        weights = [w.contiguous() for w in module.weight.chunk(parts, 1)]
        out = F.linear(inputs[0], weights[0])
        for piece, weight in zip(inputs[1:], weights[1:], strict=True):
            out = out + F.linear(piece, weight)
        return out

    return forward


def _is_colwise(style: Any) -> bool:
    from torch.distributed.tensor.parallel import ColwiseParallel

    return isinstance(style, ColwiseParallel)


def _check_style(name: str, module: nn.Module, style: Any, parts: int) -> str:
    """``colwise`` or ``rowwise`` for a style the twin mirrors; else a ValueError naming it."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    kind = (
        "colwise"
        if isinstance(style, ColwiseParallel)
        else "rowwise"
        if isinstance(style, RowwiseParallel)
        else None
    )
    defaults = {
        "colwise": ((Replicate(),), (Shard(-1),)),
        "rowwise": ((Shard(-1),), (Replicate(),)),
    }
    if kind is None or not isinstance(module, nn.Linear):
        raise ValueError(
            f"tp_plan: {name!r} is a {type(module).__name__} under {type(style).__name__}; the reference "
            "mirrors ColwiseParallel and RowwiseParallel on nn.Linear (leave other modules out of the plan)"
        )
    layouts = (tuple(style.input_layouts), tuple(style.output_layouts))
    if layouts != defaults[kind] or not style.use_local_output:
        raise ValueError(
            f"tp_plan: {name!r} uses {type(style).__name__} with input/output layouts {layouts}; the "
            f"reference mirrors the default layouts {defaults[kind]} with use_local_output=True"
        )
    if kind == "rowwise" and module.bias is not None:
        raise ValueError(
            f"tp_plan: {name!r} is a RowwiseParallel nn.Linear with a bias; the reference mirrors "
            "RowwiseParallel on bias-free linears only (Llama-style projections)"
        )
    dim = 0 if kind == "colwise" else 1
    if module.weight.shape[dim] % parts:
        raise ValueError(
            f"tp_plan: {name!r} splits weight dim {dim} of size {module.weight.shape[dim]} over tp={parts}, "
            "which does not divide it; use a tp that divides it"
        )
    return kind


def mirror(model: nn.Module, plan: dict[str, Any], parts: int) -> list[tuple[str, str]]:
    """Make every linear ``plan`` parallelizes in ``model`` (the reference's trained module)
    compute as the plan splits it over ``parts`` TP ranks; ``[(module name, "colwise"|"rowwise")]``."""
    modules = dict(model.named_modules())
    done = []
    for name, style in tp_plan.styled_modules(plan, model):
        module = modules[name]
        kind = _check_style(name, module, style, parts)
        module.forward = (_columns if kind == "colwise" else _rows)(module, parts)  # type: ignore[method-assign]
        done.append((name, kind))
    return done
