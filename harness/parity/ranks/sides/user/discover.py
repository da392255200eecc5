"""Read what a user's ``parallelize`` function did, from torch's own state (rank side).

Why read and not ask: the user's function is the thing under test, so its flags are not to be
trusted, only their effect. Every ``fully_shard`` leaves an ``FSDPModule`` with its parameter
groups (policy, reshard, offload, divide factor, mesh, sync settings, reduce hooks); DDP and
FSDP1 are wrapper modules; ``checkpoint_wrapper`` is a wrapper holding its checkpoint function
and composable ``checkpoint`` a registered forward hook; ``torch.compile`` leaves an
``OptimizedModule`` or a module's ``_compiled_call_impl`` with dynamo's context (its backend
object). Tensor parallelism is the one thing whose styles leave no trace on the modules (a
``SequenceParallel`` norm looks like a replicated one), so ``torch_private.tensor_parallel.recording_styles`` records each
``ParallelStyle._apply`` while the function runs, and nothing else.

Whatever the twin cannot mirror goes to ``Found.refused`` with the way out (FSDP1 units, DDP
below the root, ``replicate``, custom reduce hooks, a policy the emulation cannot express): the
row becomes an error naming it, never a verdict over a silently different twin.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from harness.parity.plan.precision import PrecisionPolicy
from harness.parity.ranks.sides.full import gather
from harness.parity.ranks.sides.user.found import Compiled, Found, Unit
from harness.torch_private import checkpoint, dynamo, fsdp2

_DTYPE_WORDS = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def _policy(mp: Any, where: str, refused: list[str]) -> PrecisionPolicy | None:
    """FSDP2's ``MixedPrecisionPolicy`` as the twin emulates it (``twin.py``)."""
    param = mp.param_dtype if mp.param_dtype not in (None, torch.float32) else None
    reduce = mp.reduce_dtype
    if param is None:
        if reduce not in (None, torch.float32) or mp.output_dtype not in (None, torch.float32):
            refused.append(
                f"{where}: a MixedPrecisionPolicy with float32 parameters and reduce_dtype={reduce}, "
                f"output_dtype={mp.output_dtype} is not emulated; set param_dtype too, or leave them None"
            )
        return None
    return PrecisionPolicy(
        param=_DTYPE_WORDS[param],
        reduce=_DTYPE_WORDS[reduce] if reduce is not None else None,
        output=_DTYPE_WORDS[mp.output_dtype] if mp.output_dtype is not None else None,
        inputs="units" if mp.cast_forward_inputs else "none",
    )


def _reshard(group: Any) -> str:
    post = group.post_forward_mesh_info
    if post is None:
        return "kept after forward"
    if post is group.mesh_info or post.shard_mesh_size == group.mesh_info.shard_mesh_size:
        return "after forward"
    return f"after forward to {post.shard_mesh_size} ranks"


def _unit(name: str, module: nn.Module, names: dict[int, str], refused: list[str]) -> Unit:
    from torch.distributed.fsdp import CPUOffloadPolicy

    state = fsdp2.state_of(module)
    groups = fsdp2.param_groups(state)
    where = f"fully_shard({name or 'the root'})"
    if len(groups) > 1:
        refused.append(
            f"{where} holds {len(groups)} parameter groups; the twin mirrors one per fully_shard call"
        )
    # A unit without parameters of its own (a pipeline stage's root over its layers) has no
    # group, and in torch 2.13 no mesh either: it reduces nothing.
    mesh_info = fsdp2.state_mesh_info(state) if not groups else groups[0].mesh_info
    mesh = mesh_info.mesh if mesh_info is not None else None
    dims = (
        () if mesh is None else tuple(zip(mesh.mesh_dim_names or ("",) * mesh.ndim, mesh.shape, strict=True))
    )
    if not groups:
        return Unit(
            module=name, params=(), policy=_policy(fsdp2.state_policy(state), where, refused), reshard="-",
            offload=False, divide_factor=None, mesh=dims,
        )  # fmt: skip
    group = groups[0]
    if fsdp2.has_all_reduce_hook(group):
        refused.append(
            f"{where} has an all-reduce hook (set_all_reduce_hook): its arithmetic is not mirrored"
        )
    if fsdp2.has_custom_reduce_scatter(group):
        refused.append(f"{where} has a custom reduce-scatter (set_custom_reduce_scatter): not mirrored")
    params = tuple(
        gather.clean_name(f"{names[id(owner)]}.{param_name}".lstrip("."))
        for owner, param_name in map(fsdp2.param_owner, group.fsdp_params)
    )
    return Unit(
        module=name,
        params=params,
        policy=_policy(group.mp_policy, where, refused),
        reshard=_reshard(group),
        offload=isinstance(group.offload_policy, CPUOffloadPolicy),
        divide_factor=group.gradient_divide_factor,
        mesh=dims,
        syncs=bool(group.reduce_grads),
    )


def _compiled(name: str, module: nn.Module) -> Compiled | None:
    found = dynamo.compiled_with(module)
    if found is None:
        return None
    backend = found.backend
    label = (
        getattr(backend, "compiler_name", None)
        or getattr(backend, "__name__", None)
        or type(backend).__name__
    )
    return Compiled(
        module=name, backend=backend, backend_name=str(label), fullgraph=found.fullgraph,
        dynamic=found.dynamic, how=found.how,
    )  # fmt: skip


def _checkpointed(module: nn.Module) -> bool | None:
    """Whether ``module`` is activation-checkpointed, replaying the RNG (``None``: it is not)."""
    return checkpoint.replays_rng(module)


def ties_of(model: nn.Module) -> list[tuple[str, ...]]:
    """The names of each parameter the model registers under several (a tied embedding and head)."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [tuple(found) for found in names.values() if len(found) > 1]


def _split(ties: list[tuple[str, ...]], units: list[Unit]) -> tuple[str, ...]:
    """The ties whose names more than one unit holds (``lm_head.weight = embed.weight``)."""
    holder = {name: unit.module for unit in units for name in unit.params}
    return tuple(
        " = ".join(reversed(tie)) for tie in ties if len({holder[n] for n in tie if n in holder}) > 1
    )


def read(
    result: nn.Module,
    styles: list[tuple[nn.Module, Any, Any]],
    data_parallel: int,
    ties: list[tuple[str, ...]],
) -> Found:
    """What the function that returned ``result`` did (``styles``: what ``tensor_parallel.recording_styles`` saw;
    ``ties``: the model's tied names before the function ran, ``ties_of``)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1
    from torch.nn.parallel import DistributedDataParallel as DDP

    refused: list[str] = []
    ddp = None
    root = result
    outer = []  # torch.compile(DDP(model)): compiled around DDP, its graph split at bucket boundaries
    if isinstance(dynamo.original_module(root), DDP):
        outer = [dataclasses.replace(_compiled("", root), how="torch.compile(DDP(model))")]  # type: ignore[arg-type]
        root = dynamo.original_module(root)
    if isinstance(root, DDP):
        ddp = {"bucket_cap_mb": root.bucket_bytes_cap / (1024 * 1024)}
        if getattr(root, "_comm_hook", None) is not None:
            refused.append(
                "DDP has a communication hook (register_comm_hook): its arithmetic is not mirrored"
            )
        root = root.module
    modules = list(root.named_modules(remove_duplicate=False))
    names = {id(m): gather.clean_name(n) for n, m in reversed(modules)}  # the outermost name of a module wins
    units, compiled, checkpointed = [], [], []
    for raw, module in root.named_modules():  # each module once, under its first name
        name = gather.clean_name(raw)
        if isinstance(module, FSDP1):
            refused.append(
                f"{name or 'the root'}: FSDP1 (FullyShardedDataParallel) inside a parallelize function is "
                "not mirrored; use fully_shard, or check FSDP1 with the built-in matrix (a workload without parallelize)"
            )
        elif isinstance(module, DDP):
            refused.append(f"{name}: DDP below the root is not mirrored (wrap the root, or use fully_shard)")
        if "replicate" in _registry(module):
            refused.append(f"{name or 'the root'}: replicate() is not mirrored yet; use DDP or fully_shard")
        if isinstance(module, FSDPModule):
            units.append(_unit(name, module, names, refused))
        if (found := _compiled(name, module)) is not None:
            compiled.append(found)
        if (replay := _checkpointed(module)) is not None:
            checkpointed.append((name, replay))
    if isinstance(result, DDP) and (found := _compiled("", result)) is not None:
        compiled.append(found)
    compiled += outer
    managed = {p for unit in units for p in unit.params}
    never = ()
    if ddp is None and data_parallel > 1:
        trainable = [gather.clean_name(n) for n, p in root.named_parameters() if p.requires_grad]
        never = tuple(name for name in trainable if name not in managed)
    degrees = {mesh.size() for _, _, mesh in styles}
    if len(degrees) > 1:
        refused.append(
            f"tensor parallelism over meshes of sizes {sorted(degrees)}: one TP degree is mirrored"
        )
    return Found(
        units=tuple(units),
        checkpointed=tuple(checkpointed),
        compiled=tuple(compiled),
        tp=tuple((names.get(id(m), "?"), style) for m, style, _ in styles),
        tp_degree=next(iter(degrees), None),
        tp_dim=next(((m.mesh_dim_names or (None,))[0] for _, _, m in styles), None),
        ddp=ddp,
        never_reduced=never,
        split_ties=_split(ties, units),
        refused=tuple(refused),
    )


def _registry(module: nn.Module) -> dict[str, Any]:
    return checkpoint.composable_registry(module)
