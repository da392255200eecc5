"""Rank bodies and the unsharded reference for the ShardedOptimizer suites.

The model is a dict of named parameters covering every kind the optimizer handles, with one
seed for the initial values (same on every rank and in the reference) and one seed per step for
the data (the same global batch everywhere; each rank uses its slice):

- ``dense.weight`` (8, 4): DTensor, Shard(0)
- ``dense.odd`` (5, 3): DTensor, Shard(0), uneven (4 ranks hold 2, 2, 1, 0 rows)
- ``proj.bias`` (4,): DTensor, Replicate()
- ``table.weight`` (8, 2): ShardedTensor, chunked along dim 0
- ``scale`` (3,): plain tensor (replicated)

The loss is ``sum(0.5 * (p * x) ** 2)``, elementwise in every parameter, so the gradient of each
shard is exactly the matching slice of the unsharded gradient, and a sharded run must match the
unsharded reference (up to float32 rounding of vectorised kernels).

Rank bodies run on the harness's warm ranks (``ranks.run(body, *args, world_size=N)``), take
rank and world size from ``harness.current()``, and return plain CPU tensors (full, gathered) so
the tests compare them in the controller. Ranks outlive a body, so nothing here may assume a fresh
process: the device mesh is rebuilt whenever the default process group changes.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed._shard import sharded_tensor
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed._shard.sharding_spec import ChunkShardingSpec
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh

import harness
from scaler import ShardedGradScaler, ShardedOptimizer

SHAPES: dict[str, tuple[int, ...]] = {
    "dense.weight": (8, 4),
    "dense.odd": (5, 3),
    "proj.bias": (4,),
    "table.weight": (8, 2),
    "scale": (3,),
}
DTENSOR_PLACEMENTS = {"dense.weight": [Shard(0)], "dense.odd": [Shard(0)], "proj.bias": [Replicate()]}

OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "sgd": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    "adam": (torch.optim.Adam, {"lr": 0.05}),
    "adagrad": (torch.optim.Adagrad, {"lr": 0.1}),
    "adam_fused": (torch.optim.Adam, {"lr": 0.05, "fused": True}),
}
RESHARD_OPTIMIZERS = ["sgd", "adam", "adagrad"]


# -- data and the unsharded reference ---------------------------------------------------------


def full_init() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {name: torch.randn(shape, generator=generator) for name, shape in SHAPES.items()}


def full_batch(step: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    return {name: torch.randn(shape, generator=generator) for name, shape in SHAPES.items()}


def reference_run(opt_name: str, steps: int, *, skip: frozenset[int] = frozenset()) -> dict[str, Any]:
    """Unsharded run in this process: plain full tensors, the same optimizer, steps in ``skip`` skipped."""
    cls, kwargs = OPTIMIZERS[opt_name]
    kwargs = {key: value for key, value in kwargs.items() if key != "fused"}
    params = {name: value.clone().requires_grad_() for name, value in full_init().items()}
    opt = cls(list(params.values()), **kwargs)
    for step in range(steps):
        opt.zero_grad()
        batch = full_batch(step)
        sum(0.5 * (p * batch[name]).pow(2).sum() for name, p in params.items()).backward()
        if step not in skip:
            opt.step()
    state = {name: {key: value.clone() for key, value in opt.state[p].items()} for name, p in params.items()}
    return {"params": {name: p.detach().clone() for name, p in params.items()}, "state": state}


# -- building the sharded model on a rank -----------------------------------------------------

_MESH: tuple[Any, Any] | None = None
"""``(default process group, 1-D mesh over it)``: one mesh shared by every parameter of a body."""


def _mesh(world_size: int) -> Any:
    """The 1-D CPU mesh over the current default group, built once per group.

    The harness keeps ranks warm across tests and re-creates the default group when the world size
    changes (or after a failed test), so a mesh is reused only while its group is still current.
    """
    global _MESH
    world = dist.group.WORLD
    if _MESH is None or _MESH[0] is not world:
        _MESH = (world, init_device_mesh("cpu", (world_size,)))
    assert _MESH[1].size() == world_size, f"mesh of {_MESH[1].size()} ranks, world size {world_size}"
    return _MESH[1]


def _distribute(tensor: torch.Tensor, mesh: Any, placements: Any) -> DTensor:
    """``distribute_tensor`` of a tensor every rank already holds in full, without communication
    where torch can (``src_data_rank=None``, torch >= 2.7); older torch scatters rank 0's copy,
    which is the same data."""
    if "src_data_rank" in inspect.signature(distribute_tensor).parameters:
        return distribute_tensor(tensor, mesh, placements, src_data_rank=None)
    return distribute_tensor(tensor, mesh, placements)


def build_params(world_size: int, *, zero: bool = False) -> dict[str, torch.Tensor]:
    """The model on this rank; ``zero=True`` fills it with zeros (a target that must be loaded into)."""
    init = full_init()
    if zero:
        init = {name: torch.zeros_like(value) for name, value in init.items()}
    mesh = _mesh(world_size)
    params: dict[str, torch.Tensor] = {}
    for name, placements in DTENSOR_PLACEMENTS.items():
        params[name] = torch.nn.Parameter(_distribute(init[name], mesh, placements))
    spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(world_size)])
    table = sharded_tensor.empty(spec, *SHAPES["table.weight"], requires_grad=True)
    with torch.no_grad():
        for shard in table.local_shards():
            shard.tensor.copy_(
                _narrow(init["table.weight"], shard.metadata.shard_offsets, shard.tensor.shape)
            )
    params["table.weight"] = table
    params["scale"] = torch.nn.Parameter(init["scale"].clone())
    return params


def _narrow(full: torch.Tensor, offsets: Any, shape: Any) -> torch.Tensor:
    for dim, (offset, size) in enumerate(zip(offsets, shape, strict=True)):
        full = full.narrow(dim, offset, size)
    return full


def local_loss(params: dict[str, torch.Tensor], step: int) -> torch.Tensor:
    """This rank's part of the loss; backward puts each shard's exact gradient on it."""
    batch = full_batch(step)
    terms = []
    for name, p in params.items():
        x = batch[name]
        if isinstance(p, DTensor):
            local_x = _distribute(x, p.device_mesh, p.placements).to_local()
            terms.append((p.to_local() * local_x).pow(2).sum())
        elif isinstance(p, ShardedTensor):
            for shard in p.local_shards():
                piece = _narrow(x, shard.metadata.shard_offsets, shard.tensor.shape)
                terms.append((shard.tensor * piece).pow(2).sum())
        else:
            terms.append((p * x).pow(2).sum())
    return 0.5 * sum(terms)


def make_optimizer(params: dict[str, torch.Tensor], opt_name: str) -> ShardedOptimizer:
    cls, kwargs = OPTIMIZERS[opt_name]
    return ShardedOptimizer(params, cls, **kwargs)


def train(params: dict[str, torch.Tensor], opt: ShardedOptimizer, steps: range) -> None:
    for step in steps:
        opt.zero_grad()
        local_loss(params, step).backward()
        opt.step()


# -- gathering full tensors for the controller ------------------------------------------------


def full_value(value: Any) -> Any:
    """A plain full copy of a DTensor, ShardedTensor or tensor (a collective for the first two)."""
    if isinstance(value, DTensor):
        return value.full_tensor().detach().clone()
    if isinstance(value, ShardedTensor):
        pieces = [
            (shard.metadata.shard_offsets, shard.tensor.detach().clone()) for shard in value.local_shards()
        ]
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, pieces)
        full = torch.zeros(value.metadata().size, dtype=value.dtype)
        for rank_pieces in gathered:
            for offsets, tensor in rank_pieces:
                _narrow(full, offsets, tensor.shape).copy_(tensor)
        return full
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return value


def full_params(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: full_value(p) for name, p in params.items()}


def full_state(opt: ShardedOptimizer) -> dict[str, dict[str, Any]]:
    return {
        name: {key: full_value(value) for key, value in entry.items()}
        for name, entry in opt.state_dict()["state"].items()
    }


# -- rank bodies --------------------------------------------------------------------------------


def rank_train_and_save(root: str, steps: int) -> None:
    """Train every optimizer of RESHARD_OPTIMIZERS for ``steps`` steps; save model and optimizer with DCP."""
    world_size = harness.current().world_size
    for opt_name in RESHARD_OPTIMIZERS:
        params = build_params(world_size)
        opt = make_optimizer(params, opt_name)
        train(params, opt, range(steps))
        dcp.save({"model": params, "optim": opt.state_dict()}, checkpoint_id=Path(root) / opt_name)


def rank_load_and_continue(root: str, saved_steps: int, more_steps: int) -> Any:
    """Load each optimizer's checkpoint at this world size, then train ``more_steps`` further steps.

    Returns (rank 0 only) per optimizer: the full optimizer state right after loading, and the
    full parameters at the end.
    """
    rank, world_size = harness.current().rank, harness.current().world_size
    results: dict[str, Any] = {}
    for opt_name in RESHARD_OPTIMIZERS:
        params = build_params(world_size, zero=True)
        opt = make_optimizer(params, opt_name)
        opt.initialize_state()
        optim_state = opt.state_dict()
        dcp.load({"model": params, "optim": optim_state}, checkpoint_id=Path(root) / opt_name)
        opt.load_state_dict(optim_state)
        loaded = full_state(opt)
        train(params, opt, range(saved_steps, saved_steps + more_steps))
        results[opt_name] = {"loaded_state": loaded, "params": full_params(params)}
    return results if rank == 0 else None


def _copy_values(source: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, src in source.items():
            dst = target[name]
            if isinstance(src, DTensor):
                dst._local_tensor.copy_(src._local_tensor)
            elif isinstance(src, ShardedTensor):
                for a, b in zip(src.local_shards(), dst.local_shards(), strict=True):
                    b.tensor.copy_(a.tensor)
            else:
                dst.copy_(src)


def rank_round_trip(saved_steps: int, more_steps: int) -> Any:
    """Per optimizer: save after ``saved_steps``, load into a fresh optimizer over a copy of the model,
    train both ``more_steps`` further; return both runs' full params and both state_dicts after loading.
    """
    rank, world_size = harness.current().rank, harness.current().world_size
    results: dict[str, Any] = {}
    for opt_name in RESHARD_OPTIMIZERS:
        original = build_params(world_size)
        opt = make_optimizer(original, opt_name)
        train(original, opt, range(saved_steps))
        copy = build_params(world_size, zero=True)
        _copy_values(original, copy)
        restored = make_optimizer(copy, opt_name)
        restored.load_state_dict(opt.state_dict())
        states = {"original": full_state(opt), "restored": full_state(restored)}
        train(original, opt, range(saved_steps, saved_steps + more_steps))
        train(copy, restored, range(saved_steps, saved_steps + more_steps))
        results[opt_name] = {
            "states": states,
            "original": full_params(original),
            "restored": full_params(copy),
        }
    return results if rank == 0 else None


def rank_load_full_state(saved_steps: int) -> Any:
    """Load an unsharded reference's state, as a full name-keyed state_dict, into the sharded optimizer."""
    rank, world_size = harness.current().rank, harness.current().world_size
    results: dict[str, Any] = {}
    for opt_name in RESHARD_OPTIMIZERS:
        reference = reference_run(opt_name, saved_steps)
        params = build_params(world_size)
        opt = make_optimizer(params, opt_name)
        groups = opt.state_dict()["param_groups"]
        opt.load_state_dict({"state": reference["state"], "param_groups": groups})
        results[opt_name] = full_state(opt)
    return results if rank == 0 else None


def rank_train_with_scaler(steps: int, inf_step: int) -> Any:
    """Train with ShardedGradScaler; at ``inf_step`` rank 1 alone puts an inf into a DTensor gradient.

    Returns per optimizer, from every rank: whether each step was skipped, whether that step left
    this rank's parameters and optimizer state untouched, whether the local optimizer saw the
    scaler's ``grad_scale`` (the fused path), and (rank 0) the full parameters at the end.
    """
    rank, world_size = harness.current().rank, harness.current().world_size
    results: dict[str, Any] = {}
    for opt_name in OPTIMIZERS:
        params = build_params(world_size)
        opt = make_optimizer(params, opt_name)
        saw_grad_scale: list[bool] = []
        opt.local_optimizer.register_step_pre_hook(_grad_scale_recorder(saw_grad_scale))
        scaler = ShardedGradScaler("cpu", init_scale=2.0**10, growth_interval=1000)
        record: dict[str, Any] = {"skipped": [], "untouched": [], "saw_grad_scale": saw_grad_scale}
        for step in range(steps):
            opt.zero_grad()
            scaler.scale(local_loss(params, step)).backward()
            if step == inf_step and rank == 1:
                params["dense.weight"].grad._local_tensor[0, 0] = float("inf")
            before = _local_snapshot(opt)
            scaler.step(opt)
            scaler.update()
            after = _local_snapshot(opt)
            record["skipped"].append(scaler.step_was_skipped(opt))
            record["untouched"].append(
                len(before) == len(after)
                and all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
            )
        record["params"] = full_params(params)
        results[opt_name] = record
    return results


def _grad_scale_recorder(seen: list[bool]) -> Any:
    """A step pre-hook for the local optimizer: record whether a scaler lent it ``grad_scale``."""

    def hook(optim: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        seen.append(getattr(optim, "grad_scale", None) is not None)

    return hook


def _local_snapshot(opt: ShardedOptimizer) -> list[torch.Tensor]:
    """Every local parameter tensor and local state tensor, copied."""
    tensors: list[torch.Tensor] = []
    for group in opt.param_groups:
        for p in group["params"]:
            tensors.append(p.detach().clone())
            for value in opt.state.get(p, {}).values():
                if isinstance(value, torch.Tensor):
                    tensors.append(value.detach().clone())
    return tensors


def rank_dtensor_grad_links() -> dict[str, Any]:
    """Facts about how a DTensor parameter's gradient reaches the local optimizer."""
    world_size = harness.current().world_size
    params = build_params(world_size)
    opt = make_optimizer(params, "sgd")
    weight = params["dense.weight"]
    local = next(p for p in opt.param_groups[0]["params"] if p is weight._local_tensor)
    facts: dict[str, Any] = {}
    local_loss(params, 0).backward()
    facts["local_grad_is_dtensor_grad_shard"] = local.grad is weight.grad._local_tensor
    local.grad.mul_(0.0)
    facts["in_place_unscale_reaches_dtensor_grad"] = bool((weight.grad.to_local() == 0).all())
    opt.zero_grad(set_to_none=False)
    local_loss(params, 0).backward()
    opt.zero_grad(set_to_none=False)
    facts["zero_grad_keeps_zeros"] = weight.grad is not None and bool((weight.grad.to_local() == 0).all())
    opt.zero_grad(set_to_none=True)
    facts["zero_grad_sets_none"] = weight.grad is None and local.grad is None
    # A gradient assigned by hand (no backward, so no hook) is picked up by step().
    before = weight.to_local().detach().clone()
    weight.grad = DTensor.from_local(torch.ones_like(local), weight.device_mesh, weight.placements)
    opt.step()
    facts["assigned_grad_used_by_step"] = torch.allclose(weight.to_local(), before - 0.1)
    # A Partial gradient of a replicated parameter is reduced to the parameter's placement first.
    bias = params["proj.bias"]
    opt.zero_grad()
    bias_before = bias.to_local().detach().clone()
    bias.grad = DTensor.from_local(torch.ones(4), bias.device_mesh, [Partial()])
    opt.step()
    facts["partial_grad_reduced_before_step"] = torch.allclose(
        bias.to_local(), bias_before - 0.1 * world_size
    )
    # Sharded parameters added later in their own group are stepped and saved under their names.
    params = build_params(world_size)
    first = {name: p for name, p in params.items() if name in DTENSOR_PLACEMENTS}
    opt = make_optimizer(first, "sgd")
    opt.add_param_group(
        {"params": {"table.weight": params["table.weight"], "scale": params["scale"]}, "lr": 0.2}
    )
    train(params, opt, range(1))
    saved = opt.state_dict()
    facts["added_group_saved_by_name"] = (
        [group["params"] for group in saved["param_groups"]],
        [group["lr"] for group in saved["param_groups"]],
        sorted(saved["state"]),
        type(saved["state"]["table.weight"]["momentum_buffer"]).__name__,
    )
    return facts


def rank_bad_loads() -> dict[str, str]:
    """The message of each rejected load or construction on a real process group, by scenario."""
    world_size = harness.current().world_size
    messages: dict[str, str] = {}
    params = build_params(world_size)
    opt = make_optimizer(params, "adam")
    train(params, opt, range(1))
    saved = opt.state_dict()

    # The same names, but "dense.weight" is a plain tensor now: its DTensor state cannot load directly.
    plain = dict(build_params(world_size))
    plain["dense.weight"] = torch.nn.Parameter(torch.zeros(SHAPES["dense.weight"]))
    messages["dtensor_state_into_plain"] = _message(
        lambda: make_optimizer(plain, "adam").load_state_dict(saved)
    )

    # Another shape for "dense.weight" (10 rows instead of 8).
    other = dict(build_params(world_size))
    other["dense.weight"] = torch.nn.Parameter(_distribute(torch.zeros(10, 4), _mesh(world_size), [Shard(0)]))
    messages["global_shape"] = _message(lambda: make_optimizer(other, "adam").load_state_dict(saved))

    # A partial parameter makes no sense to optimize.
    partial = {"p": torch.nn.Parameter(DTensor.from_local(torch.zeros(2), _mesh(world_size), [Partial()]))}
    messages["partial_param"] = _message(lambda: make_optimizer(partial, "adam"))

    # A full plain state tensor of the wrong global shape.
    full = {"state": {"dense.weight": {"exp_avg": torch.zeros(3, 4)}}, "param_groups": saved["param_groups"]}
    messages["full_state_shape"] = _message(
        lambda: make_optimizer(build_params(world_size), "adam").load_state_dict(full)
    )
    return messages


def _message(action: Any) -> str:
    try:
        action()
    except (TypeError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return "no error"
