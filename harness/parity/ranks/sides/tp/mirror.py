"""The unsharded twin of tensor parallelism (rank side): its split matmuls and sums.

Why the reference splits: tensor parallelism changes the local arithmetic. A ``RowwiseParallel``
linear computes ``x[..., part_t] @ W[:, part_t]^T`` on each TP rank and sums the ``T`` partial
products across the TP group; a ``ColwiseParallel`` one computes its share of the outputs, and the
gradient of its input is again a sum of ``T`` partial products. One unsplit matmul sums the same
products in another order, so an unsharded reference drifts from a correct candidate by rounding
from the first step. The twin therefore computes each TP'd linear as the plan splits it: the
partial products on the same shapes (contiguous, as the candidate's local shards are), and sums
them across the TP group as the candidate does (:class:`_Reducer`): every rank of a TP group holds
the same batch and the same whole weights, so each computes every part, and the rank at TP
coordinate ``t`` hands part ``t`` to the candidate's own redistribution (``Partial`` to the style's
layout, on the same shapes), whose ring sums each element in the candidate's order at any degree;
the result is gathered back whole (an all-gather copies). Measured bitwise: the built-in decoder,
under Megatron's and under torchtitan's sequence-parallel plan, and Hugging Face Llama, in fp32,
bf16 and fp16, at tp 2 and 4. Everything else of the twin is the unsharded model.

A ``RowwiseParallel`` linear's bias is added as torch adds it: each TP rank adds ``bias / T`` to
its partial product before the sum (DTensor's ``Replicate`` to ``Partial``), and its gradient is
the output's gradient summed, once (measured at tp 2 and 4 against torch 2.13).

What the twin takes from the candidate: the plan (which modules, which style), and nothing else;
the shapes of the parts are derived from the weight and ``T``. So a candidate whose partial sums
are not reduced, or whose plan leaves a module out that the model's code needs split, differs.

The styles the twin mirrors: ``ColwiseParallel`` and ``RowwiseParallel`` on ``nn.Linear``, with
or without a bias (any layouts: what they move changes no value, and the sums go to the layout
the style names) and on ``nn.Embedding`` (a vocabulary split adds zeros),
``SequenceParallel`` (the module run on each share of the sequence, its parameters' gradients the
shares' summed as the candidate sums them), ``PrepareModuleInput``/``PrepareModuleOutput``/
``PrepareModuleInputOutput`` (data moved, nothing computed); any
other style or module is refused with its name, before training. A linear whose style hands on a
DTensor (``use_local_output=False``, torchtitan's output head under ``loss_parallel``) hands on the
same DTensor in the twin (:func:`_handed_on`).

``loss_parallel`` (``Workload(loss_parallel=True)``): the loss and backward run under torch's
``loss_parallel()`` on both sides (:func:`loss_context`); the twin's loss then sees the
candidate's vocabulary-sharded logits and runs torch's own parallel cross-entropy on them, and
its gradient is gathered back whole (:class:`_Share`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from harness.parity.workload import tp_plan


class _Reducer:
    """How the candidate sums a ``Partial`` tensor over its TP group: this rank's part (its TP
    coordinate's) through the same redistribution, to the layout the style names, then gathered
    whole. Without a mesh (one process: a test of the split alone) the parts are summed in order,
    which is the candidate's sum for two parts only (two addends sum alike in any order)."""

    def __init__(self, mesh: Any | None) -> None:
        self.mesh = mesh
        self.coordinate = mesh.get_local_rank() if mesh is not None else 0

    def sum(self, parts: list[torch.Tensor], to: Any) -> torch.Tensor:
        if self.mesh is None:
            total = parts[0]
            for part in parts[1:]:
                total = total + part
            return total
        from torch.distributed.tensor import DTensor, Partial

        local = parts[self.coordinate].contiguous()
        summed = DTensor.from_local(local, self.mesh, [Partial()], run_check=False)
        return summed.redistribute(self.mesh, [to]).full_tensor()


def _replicate() -> Any:
    from torch.distributed.tensor import Replicate

    return Replicate()


class _RingSum(torch.autograd.Function):
    """The sum of a ``RowwiseParallel`` linear's partial products, as its output layout has it;
    each part's gradient is the output's, whole (the candidate's backward gathers it)."""

    @staticmethod
    def forward(ctx: Any, reducer: _Reducer, to: Any, *parts: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.count = len(parts)
        return reducer.sum(list(parts), to)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return (None, None, *(grad for _ in range(ctx.count)))


class _BiasShares(torch.autograd.Function):
    """``bias / T`` once per TP rank (DTensor's ``Replicate`` to ``Partial``); the bias's gradient is
    one part's, as each candidate rank's is (every part receives the same output gradient)."""

    @staticmethod
    def forward(ctx: Any, bias: torch.Tensor, parts: int) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        return tuple(bias / parts for _ in range(parts))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, None]:  # type: ignore[override]
        return next((grad for grad in grads if grad is not None), None), None


class _FanOut(torch.autograd.Function):
    """One copy of ``x`` per TP rank, as one autograd node: each copy collects the gradients one TP
    rank computes locally from its share of the weights (summed in the order autograd delivers
    them, as that rank's autograd does), and the node sums the ranks' totals as the candidate's TP
    all-reduce (or reduce-scatter, to ``to``) of the ``Partial`` gradient does (:class:`_Reducer`),
    before autograd adds the result to the gradients of the input's other consumers."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, parts: int, reducer: _Reducer, to: Any
    ) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        ctx.reducer, ctx.to = reducer, to
        return tuple(x.view_as(x) for _ in range(parts))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, None, None, None]:  # type: ignore[override]
        held = next((grad for grad in grads if grad is not None), None)
        if held is None:
            return None, None, None, None
        parts = [grad if grad is not None else torch.zeros_like(held) for grad in grads]
        return ctx.reducer.sum(parts, ctx.to), None, None, None


class _Shares:
    """The per-rank copies of the tensors the enclosing ``PrepareModuleInput`` modules made
    ``Replicate``, while those modules run (one mirrored model's: :func:`mirror` makes one and
    hands it to the forwards it installs): the column-split linears inside take their rank's copy,
    so each rank's partial gradients are summed before the ranks'."""

    def __init__(self) -> None:
        self.running: list[tuple[torch.Tensor, ...]] = []
        """One entry per replicated-input module running now, innermost last: its copies, the
        first of which is what its module's code receives."""

    def of(self, x: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
        """The copies whose first is ``x`` itself (not an equal tensor), if a running module made them."""
        return next((shares for shares in self.running if shares[0] is x), None)

    @contextlib.contextmanager
    def held(self, shares: tuple[torch.Tensor, ...]) -> Iterator[None]:
        self.running.append(shares)
        try:
            yield
        finally:
            self.running.pop()  # the modules nest: the innermost ends first


def _columns(module: nn.Linear, parts: int, held: _Shares, reducer: _Reducer, to: Any) -> Any:
    def forward(x: torch.Tensor) -> torch.Tensor:
        shares = held.of(x) or _FanOut.apply(x, parts, reducer, to)
        weights = module.weight.chunk(parts, 0)
        biases = module.bias.chunk(parts, 0) if module.bias is not None else [None] * parts
        return torch.cat(
            [F.linear(share, w.contiguous(), b) for share, w, b in zip(shares, weights, biases, strict=True)],
            -1,
        )

    return forward


def _replicated_input(module: nn.Module, parts: int, held: _Shares, reducer: _Reducer, to: Any) -> Any:
    """A module whose ``PrepareModuleInput`` hands its code a ``Replicate`` DTensor: the TP
    reduction of its input's gradient happens here (to the layout its input came in), once for
    every column-split linear inside."""
    inner = module.forward

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        shares = _FanOut.apply(x, parts, reducer, to)
        with held.held(shares):
            return inner(shares[0], *args, **kwargs)

    return forward


def _rows(module: nn.Linear, parts: int, reducer: _Reducer, to: Any) -> Any:
    def forward(x: torch.Tensor) -> torch.Tensor:
        inputs = [piece.contiguous() for piece in x.chunk(parts, -1)]
        weights = [w.contiguous() for w in module.weight.chunk(parts, 1)]
        shares = _BiasShares.apply(module.bias, parts) if module.bias is not None else [None] * parts
        products = [  # the bias inside each product, as the candidate's addmm adds it (one rounding)
            F.linear(piece, weight, share)
            for piece, weight, share in zip(inputs, weights, shares, strict=True)
        ]
        return _RingSum.apply(reducer, to, *products)

    return forward


def is_colwise(style: Any) -> bool:
    from torch.distributed.tensor.parallel import ColwiseParallel

    return isinstance(style, ColwiseParallel)


def is_sequence(style: Any) -> bool:
    from torch.distributed.tensor.parallel import SequenceParallel

    return isinstance(style, SequenceParallel)


def _sequence(module: nn.Module, dim: int, parts: int, reducer: _Reducer) -> Any:
    """A ``SequenceParallel`` module (a norm) run on each TP rank's share of the sequence: the parts
    computed apart and joined, each with its own copy of the module's parameters, whose gradients
    are summed across the TP group as the candidate's ``Partial`` ones are (:class:`_FanOut`)."""
    inner = module.forward
    names = [name for name, _ in module.named_parameters(recurse=False)]
    inside = [False]  # the forward a part's functional call reaches is the module's own

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if inside[0]:
            return inner(x, *args, **kwargs)
        copies = {name: _FanOut.apply(getattr(module, name), parts, reducer, _replicate()) for name in names}
        outs = []
        for index, piece in enumerate(x.chunk(parts, dim)):
            inside[0] = True
            try:
                own = {name: copy[index] for name, copy in copies.items()}
                outs.append(torch.func.functional_call(module, own, (piece.contiguous(), *args), kwargs))
            finally:
                inside[0] = False
        return torch.cat(outs, dim)

    return forward


class _Share(torch.autograd.Function):
    """This TP rank's share of a whole tensor along ``dim`` (the local tensor of the candidate's
    ``Shard(dim)`` DTensor); its gradient whole again: every rank's share gathered over the TP
    group, each computed on that rank as the candidate's rank computes its own."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, mesh: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.dim, ctx.mesh = dim, mesh
        return x.chunk(mesh.size(), dim)[mesh.get_local_rank()].contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        from torch.distributed.tensor import DTensor, Shard

        shares = DTensor.from_local(grad.contiguous(), ctx.mesh, [Shard(ctx.dim)], run_check=False)
        return shares.full_tensor(), None, None


def _handed_on(name: str, style: Any, mesh: Any | None) -> Any:
    """How the twin hands on the output of a linear whose style keeps it a DTensor
    (``use_local_output=False``: torchtitan's output head under ``loss_parallel``): the same
    DTensor, this rank's share of the twin's whole output, so that whatever the code after it
    does (``cross_entropy`` under ``loss_parallel()``, a redistribution) runs the candidate's ops
    on the candidate's values. ``None``: the style hands on a plain tensor."""
    if getattr(style, "use_local_output", True):
        return None
    from torch.distributed.tensor import DTensor, Replicate, Shard

    layout = style.output_layouts[0]
    if mesh is None or not isinstance(layout, (Replicate, Shard)):
        raise ValueError(
            f"tp_plan: {name!r} hands on a DTensor {layout} (use_local_output=False); the reference mirrors "
            "Shard and Replicate outputs on a TP mesh"
        )

    def hand(out: torch.Tensor) -> torch.Tensor:
        local = out if isinstance(layout, Replicate) else _Share.apply(out, layout.dim, mesh)
        return DTensor.from_local(local, mesh, [layout], run_check=False)

    return hand


def _input_side(style: Any) -> Any:
    """A ``PrepareModuleInputOutput``'s input half (its output half moves data only), else ``style``."""
    from torch.distributed.tensor.parallel import PrepareModuleInputOutput

    return style.prepare_module_input if isinstance(style, PrepareModuleInputOutput) else style


def _kind(name: str, module: nn.Module, style: Any, parts: int) -> str:
    """How the twin computes ``module`` under ``style``: ``colwise``/``rowwise`` (a linear split),
    ``sequence`` (run per sequence share), ``layout`` (the style moves data only: the twin's
    values are already whole); else a ValueError naming the style."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    style = _input_side(style)
    if isinstance(style, PrepareModuleInput):
        from torch.distributed.tensor import Replicate

        desired = tuple(style.desired_input_layouts or ())
        gathered = bool(desired) and isinstance(desired[0], Replicate) and not style.use_local_output
        return "replicated" if gathered else "layout"
    if isinstance(style, PrepareModuleOutput):
        return "layout"
    if isinstance(style, SequenceParallel):
        return "sequence"
    if isinstance(style, (ColwiseParallel, RowwiseParallel)) and isinstance(module, nn.Embedding):
        # A vocabulary split sums one looked-up row with zeros, an embedding-dim split joins
        # columns: both exact, the whole lookup's values.
        return "layout"
    kind = (
        "colwise"
        if isinstance(style, ColwiseParallel)
        else "rowwise"
        if isinstance(style, RowwiseParallel)
        else None
    )
    if kind is None or not isinstance(module, nn.Linear):
        raise ValueError(
            f"tp_plan: {name!r} is a {type(module).__name__} under {type(style).__name__}; the reference "
            "mirrors ColwiseParallel and RowwiseParallel on nn.Linear and nn.Embedding, SequenceParallel, "
            "PrepareModuleInput, PrepareModuleOutput and PrepareModuleInputOutput (leave other modules out "
            "of the plan)"
        )
    dim = 0 if kind == "colwise" else 1
    if module.weight.shape[dim] % parts:
        raise ValueError(
            f"tp_plan: {name!r} splits weight dim {dim} of size {module.weight.shape[dim]} over tp={parts}, "
            "which does not divide it; use a tp that divides it"
        )
    return kind


def loss_context(workload: Any) -> contextlib.AbstractContextManager[Any]:
    """torch's ``loss_parallel()`` around a step's losses and backward, where the workload's
    training runs them so (``Workload.loss_parallel``); it changes nothing on plain tensors."""
    if not workload.loss_parallel:
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def mirror(
    model: nn.Module, plan: dict[str, Any], parts: int, mesh: Any | None = None
) -> list[tuple[str, str]]:
    """Make every module ``plan`` parallelizes in ``model`` (the reference's trained module) compute
    as the plan splits it over ``parts`` TP ranks, summing as the candidate does over ``mesh`` (its
    1-D TP mesh; ``None``: one process, exact for two parts only); ``[(module name, how)]``.

    The layouts a style moves data between (all-gathers, the chunks of a redistribution) change no
    value, so a linear is mirrored by its split whatever its input and output layouts; its sums go
    to the layout the style names; a ``SequenceParallel`` module runs per sequence share."""
    modules = dict(model.named_modules())
    held = _Shares()
    reducer = _Reducer(mesh)
    done = []
    for name, style in tp_plan.styled_modules(plan, model):
        module = modules[name]
        kind = _kind(name, module, style, parts)
        if kind == "colwise":
            to = (style.input_layouts or (_replicate(),))[0]
            module.forward = _columns(module, parts, held, reducer, to)  # type: ignore[method-assign, arg-type]
        elif kind == "rowwise":
            to = (style.output_layouts or (_replicate(),))[0]
            module.forward = _rows(module, parts, reducer, to)  # type: ignore[method-assign, arg-type]
        hand = _handed_on(name, style, mesh) if kind in ("colwise", "rowwise") else None
        if hand is not None:
            module.forward = lambda x, _split=module.forward, _hand=hand: _hand(_split(x))  # type: ignore[method-assign]
        elif kind == "replicated":
            to = (_input_side(style).input_layouts or (_replicate(),))[0]
            module.forward = _replicated_input(module, parts, held, reducer, to)  # type: ignore[method-assign]
        elif kind == "sequence":
            dim = style.sequence_sharding[0].dim
            module.forward = _sequence(module, dim, parts, reducer)  # type: ignore[method-assign]
        done.append((name, kind))
    return done
