"""The reference reduces its gradients through the candidate's collectives, on the candidate's
buffer layout (rank side), so that every element is summed in the same order on both sides.

Why: two addends sum the same in any order, so at world size 2 any reduction gives the
candidate's bits. From 3 ranks on the order decides the last bits, and a collective's order is set
by the buffer it reduces: gloo's ring splits the buffer into chunks by byte offset and total
length, and the element in chunk ``c`` is summed ``x_c + (x_{c+1} + (... + x_{c-1}))``. A reference
that reduces one flat buffer of every gradient (as DDP's buckets or a hand-made all-reduce do)
puts each element in another chunk than FSDP's per-unit buffers, and the two runs drift apart by
rounding alone. Reduced here through the same collective on the same layout, they do not: the
verdict can stay bitwise at any world size on a deterministic backend.

The layouts, read in torch 2.13's sources (``_fsdp_collectives.foreach_reduce``,
``_runtime_utils._reduce_grad``, ``_flat_param._init_flat_param_and_metadata``):

* **FSDP2**: one buffer per parameter group (a ``fully_shard`` call's own parameters, those of
  nested units excluded, in registration order), only the parameters that have a gradient; each
  gradient padded on dim 0 to a multiple of the shard group's size and laid out by
  ``torch._chunk_cat`` (row ``r`` of the buffer holds chunk ``r`` of every gradient in turn);
  reduce-scattered over the shard group. HSDP (``fully_shard(mesh=(replicate, shard))``): then
  all-reduced over the replicate group, each stage with ``AVG`` where FSDP2 averages (torch 2.13
  ``_get_gradient_divide_factors``: ``AVG`` over the shard group, then ``AVG`` over the replicas).
  With tensor parallelism the shard group is the mesh's ``dp`` dimension.
* **FSDP1**: one flat gradient per unit (the unit's own parameters in module order; under
  ``use_orig_params`` each one starts at a multiple of 16 bytes of the compute dtype, zeros
  between), padded with zeros at the end to a multiple of the shard group's size; reduce-scattered
  over the shard group (``HYBRID_SHARD``: then all-reduced over the replicate group), or all-reduced
  whole (``NO_SHARD``).
* **DDP**: one flat all-reduce of every gradient (for a DDP candidate's low-precision twin).

Not taken from the candidate: the divide factors (``twin.divide_factors``: a wrong factor on the
candidate's side still shows), which parameters exist, and every value. The reduced shards are
gathered back (copies: no rounding). Where the order is free (2 ranks): ``two_ranks/order_free.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from harness.parity.plan.config import ParityConfig
from harness.parity.ranks.sides import stages as split
from harness.parity.ranks.sides.two_ranks import order_free
from harness.torch_private import tensors


@dataclasses.dataclass(frozen=True, slots=True)
class Bucket:
    """One collective's buffer: the parameters it holds, by index into the model's parameter list
    (``nn.Module.parameters()`` order), in the buffer's order."""

    params: tuple[int, ...]
    align: int = 0
    """FSDP1 ``use_orig_params``: each parameter starts at a multiple of this many elements."""


@dataclasses.dataclass(frozen=True, slots=True)
class Layout:
    """How a candidate lays out and reduces its gradients."""

    engine: str
    """``ddp``, ``fsdp1`` or ``fsdp2``."""
    buckets: tuple[Bucket, ...]
    sharded: bool = True
    """FSDP: reduce-scatter (False: FSDP1 ``NO_SHARD``, an all-reduce of the whole flat gradient)."""
    hybrid: bool = False
    """FSDP1 ``HYBRID_SHARD``: shard groups of 2 ranks, then an all-reduce across them."""
    orig_params: bool = False
    """FSDP1 ``use_orig_params``: its optimizer steps each parameter's part of the rank's shard,
    not the flat shard itself (``step_pieces.py``)."""
    mesh: tuple[tuple[int, int], tuple[str, str]] | None = None
    """FSDP2 on a 2-D mesh (``plan/config/mesh.py``): ``((rows, columns), names)``; HSDP's names are
    ``("replicate", "shard")``, tensor parallelism's ``("dp", "tp")`` (reduced over ``dp`` only)."""
    tp_dims: tuple[int | None, ...] = ()
    """Tensor parallelism: per parameter, the dim TP shards it on (``None``: whole); a ``dp`` group
    reduces the shares of its TP coordinate (``_tp_bucket``)."""
    groups_from: tuple[tuple[tuple[str, int], ...], tuple[str, ...]] | None = None
    """A user's function or a pipeline: ``(its mesh, the dims its units shard over)``."""


def _owners(model: nn.Module, units: list[nn.Module], engine: str) -> dict[int, int]:
    """For each parameter (by ``id``), the index in ``units`` of the unit that manages it (absent:
    the root's). FSDP1 wraps units bottom-up in module order (``_recursive_wrap``: children before
    their parent, earlier siblings first) and the first wrap takes a shared parameter (measured).
    FSDP2's engine calls ``fully_shard`` on the units in reverse module order, innermost first; a
    parameter two sibling units share is managed by both there (torch 2.13 does not support it),
    and here goes to the first call's."""
    position = {id(unit): index for index, unit in enumerate(units)}
    order: list[int] = []

    def post_order(module: nn.Module) -> None:
        for child in module.children():
            post_order(child)
        if id(module) in position and module is not model:
            order.append(position[id(module)])

    if engine == "fsdp1":
        post_order(model)
    else:
        order = list(reversed(range(len(units))))
    owner: dict[int, int] = {}
    for index in order:
        for param in units[index].parameters():
            owner.setdefault(id(param), index)
    return owner


def of(config: ParityConfig, model: nn.Module, units: list[nn.Module], param_dtype: torch.dtype) -> Layout:
    """The layout of ``config``'s candidate over ``model`` (the reference's copy; ``units``: its
    modules the candidate wraps, in module order; ``param_dtype``: the dtype backward computes in)."""
    params = list(model.parameters())
    if config.engine not in ("fsdp1", "fsdp2"):
        return Layout(engine=config.engine, buckets=(Bucket(tuple(range(len(params)))),))
    owner = _owners(model, units, config.engine)
    groups: dict[int, list[int]] = {}
    stage = split.stage_of_params(config, model)  # a pipeline: each stage's root reduces its own
    for index, param in enumerate(params):
        groups.setdefault(owner.get(id(param), -1 - stage.get(index, 0)), []).append(index)
    keys = sorted(groups, key=lambda k: (k < 0, abs(k)))  # module order, the roots last (no value changes)
    align = 16 // torch.empty((), dtype=param_dtype).element_size() if config.layout.use_orig_params else 0
    buckets = tuple(Bucket(tuple(groups[k]), align if config.engine == "fsdp1" else 0) for k in keys)
    if config.engine == "fsdp2":
        piped = split.stage_groups(config)  # a pipeline reduces over each stage's dp group
        grid = split.tp_grid(config) if piped else config.mesh.shape(config.world_size)
        return Layout(
            engine="fsdp2", buckets=buckets, mesh=grid, groups_from=piped, tp_dims=_tp_dims(config, model)
        )
    return Layout(
        engine="fsdp1",
        buckets=buckets,
        sharded=config.layout.sharding != "no_shard",
        hybrid=config.layout.sharding == "hybrid_shard",
        orig_params=config.layout.use_orig_params,
    )


def flat_starts(numels: list[int], align: int, shards: int | None) -> tuple[list[int], int]:
    """Where each of a FSDP1 unit's parameters (``numels``, in the flat parameter's order) starts in
    its flat buffer, and the buffer's length: each start a multiple of ``align`` (0: packed; zeros
    between), the length padded with zeros at the end to a multiple of ``shards`` (``None``:
    ``NO_SHARD`` without alignment, unpadded). The one copy of the rule: the gradient buffer reduced
    here and the flat shards the reference steps (``step_pieces.py``) both read it."""
    starts: list[int] = []
    total = 0
    for numel in numels:
        if align and total % align:
            total += align - total % align
        starts.append(total)
        total += numel
    if shards is not None:
        total += -total % shards
    return starts, total


def _tp_dims(config: ParityConfig, model: nn.Module) -> tuple[int | None, ...]:
    """Per parameter of ``model``, the dim the TP plan shards it on (``()`` without TP)."""
    if config.mesh.tp is None:
        return ()
    from harness.parity.workload import registry, tp_plan

    dims = tp_plan.sharded_dims(tp_plan.resolve(registry.get(config.workload), model), model)
    return tuple(dims.get(name) for name, _ in model.named_parameters())


def _divide(tensor: torch.Tensor, factor: float | None) -> None:
    if factor is not None and factor != 1:
        tensor.div_(factor)


def _op(
    layout: Layout, factors: tuple[float | None, float | None], groups: tuple[Any, Any]
) -> tuple[Any, float | None, float | None]:
    """``(reduce op, divide before, divide after)``. FSDP2 divides by the whole data-parallel size
    after the sum with the collective's own ``AVG`` (NCCL pre-multiplies by ``1/n`` in the reduce
    dtype; gloo sums, then divides; HSDP averages in each stage): where the reference's own factors
    say exactly that (nothing before, the data-parallel size after), it asks the same collectives
    for ``AVG``; else ``SUM`` and divisions."""
    pre, post = factors
    shard, replicate = groups
    size = dist.get_world_size(shard) * (dist.get_world_size(replicate) if replicate is not None else 1)
    if layout.engine == "fsdp2" and pre is None and post == size:
        return dist.ReduceOp.AVG, None, None
    return dist.ReduceOp.SUM, pre, post


def reverse_sum(buffer: torch.Tensor, op: Any) -> torch.Tensor:
    """Every rank's ``buffer`` summed in reverse rank order (``AVG``: then divided by the world)."""
    world = dist.get_world_size()
    gathered = torch.empty(world * buffer.numel(), dtype=buffer.dtype, device=buffer.device)
    dist.all_gather_into_tensor(gathered, buffer.contiguous().view(-1))
    rows = gathered.view(world, -1)
    total = rows[world - 1].clone()
    for rank in range(world - 2, -1, -1):
        total += rows[rank]
    if op == dist.ReduceOp.AVG:
        total /= world
    return total.view_as(buffer)


def _scattered_and_gathered(
    buffer: torch.Tensor,
    layout: Layout,
    factors: tuple[float | None, float | None],
    groups: tuple[Any, Any],
    in_reverse: bool,
) -> torch.Tensor:
    """``buffer`` divided before, reduce-scattered over the shard group, all-reduced over the
    replicas, divided after, gathered back whole (``in_reverse``: :func:`reverse_sum` instead)."""
    shard, replicate = groups
    op, pre, post = _op(layout, factors, groups)
    _divide(buffer, pre)
    if in_reverse:
        whole = reverse_sum(buffer, op)
    elif order_free.free(groups):  # a + b is b + a: one all-reduce gives the same bits
        whole = buffer
        dist.all_reduce(whole, op=op, group=shard)
    else:
        out = buffer.new_empty(buffer.numel() // dist.get_world_size(shard))
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # 2.13; older
        scatter(out, buffer, op=op, group=shard)
        if replicate is not None:
            dist.all_reduce(out, op=op, group=replicate)
        whole = torch.empty_like(buffer)
        dist.all_gather_into_tensor(whole, out, group=shard)  # a copy: divided after, the same bits
    _divide(whole, post)
    return whole


def _all_reduced(
    buffer: torch.Tensor, factors: tuple[float | None, float | None], in_reverse: bool
) -> torch.Tensor:
    pre, post = factors
    _divide(buffer, pre)
    if in_reverse:
        buffer = reverse_sum(buffer, dist.ReduceOp.SUM)
    else:
        dist.all_reduce(buffer)
    _divide(buffer, post)
    return buffer


def _groups(layout: Layout, device: torch.device) -> tuple[Any, Any]:
    """``(shard group, replicate group or None)``: HYBRID_SHARD's mesh as the candidate builds it
    (``engines.FSDP1.wrap``: replicate x shard, shard groups of 2 ranks), FSDP2's 2-D meshes as
    ``Mesh.shape`` gives them (HSDP: shard, then replicate; TP: ``dp`` only)."""
    from harness.parity.ranks.sides.full import gather

    if layout.groups_from is not None:  # a user's function (``user/reference.py``)
        dims, names = layout.groups_from
        mesh = gather.mesh(device.type, tuple(s for _, s in dims), tuple(n for n, _ in dims))
        return mesh[names[-1]].get_group(), mesh[names[0]].get_group() if len(names) == 2 else None
    if layout.mesh is not None:
        shape, names = layout.mesh
        mesh = gather.mesh(device.type, shape, names)
        if names == ("dp", "tp"):
            return mesh["dp"].get_group(), None
        return mesh["shard"].get_group(), mesh["replicate"].get_group()
    if not layout.hybrid:
        return dist.group.WORLD, None
    world = dist.get_world_size()
    mesh = gather.mesh(device.type, (world // 2, 2), ("replicate", "shard"))
    return mesh["shard"].get_group(), mesh["replicate"].get_group()


def _fsdp2_bucket(
    grads: list[torch.Tensor],
    layout: Layout,
    factors: tuple[float | None, float | None],
    groups: tuple[Any, Any],
    in_reverse: bool,
) -> list[torch.Tensor]:
    world = dist.get_world_size(groups[0])  # the shard group's size
    rows = [g.reshape(1) if g.dim() == 0 else g for g in grads]
    chunked = tensors.chunk_cat(rows, dim=0, num_chunks=world)  # (world, per-rank numel)
    whole = _scattered_and_gathered(chunked.reshape(-1), layout, factors, groups, in_reverse).view(world, -1)
    out, offset = [], 0
    for grad, row in zip(grads, rows, strict=True):
        rows_per_rank = -(-row.shape[0] // world)
        per_rank = rows_per_rank * (row.numel() // row.shape[0] if row.shape[0] else 0)
        padded = whole[:, offset : offset + per_rank].reshape(rows_per_rank * world, *row.shape[1:])
        out.append(padded[: row.shape[0]].reshape(grad.shape).contiguous())  # fused kernels: in order
        offset += per_rank
    return out


def _tp_bucket(
    grads: list[torch.Tensor],
    dims: list[int | None],
    layout: Layout,
    factors: tuple[float | None, float | None],
    groups: tuple[Any, Any],
    in_reverse: bool,
) -> list[torch.Tensor]:
    """An FSDP2 bucket under tensor parallelism: TP rank ``c`` reduces over its ``dp`` group a
    buffer of its shares (each TP'd gradient's chunk ``c`` on its dim, the others whole), so the
    ring sums each element at the offset it has there. Every rank of the reference holds whole
    gradients of its ``dp`` coordinate's batch, so it builds the buffer of every TP coordinate and
    reduces each over its own ``dp`` group (the same ranks in the same ring positions, the same
    layout, the same values as coordinate ``c``'s candidates), then joins the shares."""
    (_, parts), _ = layout.mesh  # type: ignore[misc]
    mine = dist.get_rank() % parts
    reduced = [
        _fsdp2_bucket(
            [g if d is None else g.chunk(parts, d)[c].contiguous() for g, d in zip(grads, dims, strict=True)],
            layout,
            factors,
            groups,
            in_reverse,
        )
        for c in range(parts)
    ]
    return [
        reduced[mine][i] if d is None else torch.cat([reduced[c][i] for c in range(parts)], d)
        for i, d in enumerate(dims)
    ]


def _fsdp1_bucket(
    grads: list[torch.Tensor],
    align: int,
    factors: tuple[float | None, float | None],
    layout: Layout,
    groups: tuple[Any, Any],
    in_reverse: bool,
) -> list[torch.Tensor]:
    shards = dist.get_world_size(groups[0]) if align or layout.sharded else None
    starts, total = flat_starts([g.numel() for g in grads], align, shards)
    buffer = grads[0].new_zeros(total)
    for start, grad in zip(starts, grads, strict=True):
        buffer[start : start + grad.numel()] = grad.reshape(-1)
    whole = (
        _scattered_and_gathered(buffer, layout, factors, groups, in_reverse)
        if layout.sharded
        else _all_reduced(buffer, factors, in_reverse)
    )
    return [whole[s : s + g.numel()].view_as(g) for s, g in zip(starts, grads, strict=True)]


def reduce(
    layout: Layout,
    params: list[torch.Tensor],
    grads: list[torch.Tensor | None],
    reduce_dtype: torch.dtype,
    factors: tuple[float | None, float | None],
    *,
    in_reverse: bool = False,
    consume: bool = False,
) -> list[torch.Tensor | None]:
    """``grads`` (one per parameter of ``params``, the layout's model's, ``None`` where a parameter
    has none) averaged over the ranks as the candidate averages them: cast to ``reduce_dtype``,
    divided by ``factors`` (before, after the sum), each bucket through the candidate's collective
    on the candidate's layout. A bucket whose parameters have no gradient is not reduced (FSDP
    skips it too); in an FSDP1 bucket a parameter without one is zeros in the flat gradient, and
    stays without one.

    ``in_reverse``: each bucket's buffer is gathered from every rank and summed in reverse rank
    order (:func:`reverse_sum`) instead of through the candidate's collective: another order, still
    correct. The drift's second reference (``ranks/drift.py``) reduces so, to show the drift a
    legitimate reordering alone produces; its engine says so (``Engine.summed_in_reverse``).
    ``consume``: ``grads`` is the caller's to give up; each bucket's entries become ``None`` once
    reduced, so one bucket, not the model, is held both unreduced and reduced."""
    out: list[torch.Tensor | None] = [None] * len(grads)
    device = next((g.device for g in grads if g is not None), torch.device("cpu"))
    groups = _groups(layout, device) if layout.engine in ("fsdp1", "fsdp2") else (dist.group.WORLD, None)
    if not in_reverse and not layout.tp_dims and order_free.free(groups):  # 2 ranks: flat all-reduces
        how = _op(layout, factors, groups)
        return order_free.reduce(layout.buckets, grads, reduce_dtype, how, groups[0], out, consume)
    for bucket in layout.buckets:
        held = [i for i in bucket.params if grads[i] is not None]
        if not held:
            continue
        if layout.engine == "fsdp2":
            cast = [grads[i].to(reduce_dtype) for i in held]  # type: ignore[union-attr]
            if layout.tp_dims:
                reduced = _tp_bucket(
                    cast, [layout.tp_dims[i] for i in held], layout, factors, groups, in_reverse
                )
            else:
                reduced = _fsdp2_bucket(cast, layout, factors, groups, in_reverse)
        elif layout.engine == "fsdp1":
            members = [
                grads[i].to(reduce_dtype)
                if grads[i] is not None  # type: ignore[union-attr]
                else torch.zeros(params[i].shape, dtype=reduce_dtype, device=device)
                for i in bucket.params
            ]
            whole = _fsdp1_bucket(members, bucket.align, factors, layout, groups, in_reverse)
            position = {index: at for at, index in enumerate(bucket.params)}
            reduced = [whole[position[i]] for i in held]
        else:
            cast = [grads[i].to(reduce_dtype) for i in held]  # type: ignore[union-attr]
            flat = _all_reduced(tensors.flatten_dense(cast), factors, in_reverse)
            reduced = list(tensors.unflatten_dense(flat, cast))
        for index, grad in zip(held, reduced, strict=True):
            out[index], grads[index] = grad, None if consume else grads[index]
    return out
