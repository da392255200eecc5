"""One :class:`~harness.parity.plan.precision.PrecisionPolicy` in torch's terms (rank side): FSDP's
arguments for the candidate, and the same policy emulated on an unsharded model for the reference.

Why both here: the reference is the candidate's unsharded twin, so every field the candidate gets
must be mirrored by the reference, and a field added on one side only is visible in one module.
The emulation follows torch 2.13's code, not its documentation:

* parameters: the floating-point ones in ``param`` for forward and backward, float32 masters for
  the optimizer (FSDP's ``_fsdp_param.py`` skips integer parameters too);
* buffers: cast to ``buffers`` when set (FSDP1 ``buffer_dtype``), else left as the model made them
  (FSDP2 never casts buffers: a rotary ``inv_freq`` stays float32);
* inputs: the floating-point args and kwargs of the root (FSDP1's ``cast_root_forward_inputs``),
  or of every wrapped module (FSDP2's ``cast_forward_inputs``, run in a pre-hook of each
  ``fully_shard`` module), through FSDP's own tree walk (``_apply_to_tensors``, which also enters
  dataclasses such as a Hugging Face ``ModelOutput``);
* outputs: every wrapped module's floating-point outputs cast to ``output`` (FSDP2's
  ``output_dtype``, in its post-forward);
* reduction: the low-precision gradients cast to ``reduce``, averaged across ranks through the
  candidate's own collectives on its buffer layout (``reduce_layout.py``: the same order of
  summation for every element, at any world size) with the candidate's own divide factors (``divide_factors``: FSDP splits the world size into a power of two
  divided before the sum and the rest after it, where DDP divides by all of it before; division by a
  power of two is exact, but a float16 sum of halves overflows where one of quarters does not),
  then cast to float32 for the master, or kept in ``param`` (FSDP1's ``keep_low_precision_grads``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from harness.parity.plan.precision import PrecisionPolicy
from harness.parity.ranks.sides import reduce_layout

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def dtype(name: str | None) -> torch.dtype | None:
    return None if name is None else DTYPES[name]


# -- the candidate ----------------------------------------------------------------------------------
def fsdp1_mixed_precision(policy: PrecisionPolicy) -> Any:
    """FSDP1's ``MixedPrecision`` for ``policy``."""
    from torch.distributed.fsdp import MixedPrecision

    return MixedPrecision(
        param_dtype=dtype(policy.param),
        reduce_dtype=dtype(policy.reduce_dtype),
        buffer_dtype=dtype(policy.buffers),
        keep_low_precision_grads=policy.keep_low_precision_grads,
        cast_forward_inputs=policy.inputs == "units",
        cast_root_forward_inputs=policy.inputs != "none",
    )


def fsdp2_mixed_precision(policy: PrecisionPolicy) -> Any:
    """FSDP2's ``MixedPrecisionPolicy`` for ``policy`` (``check_for('fsdp2')`` refused the rest)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(
        param_dtype=dtype(policy.param),
        reduce_dtype=dtype(policy.reduce_dtype),
        output_dtype=dtype(policy.output),
        cast_forward_inputs=policy.inputs == "units",
    )


# -- the reference ------------------------------------------------------------------------------------
def _cast_floats(value: Any, to: torch.dtype) -> Any:
    """``value`` with its floating-point tensors in ``to``, walked as FSDP walks forward args."""
    from harness.torch_private import tensors

    return tensors.apply_to_tensors(
        lambda t: t.to(to) if torch.is_floating_point(t) and t.dtype != to else t, value
    )


def working_copy(module: nn.Module, policy: PrecisionPolicy) -> nn.Module:
    """A copy of ``module`` whose floating-point parameters are in ``param`` and whose
    floating-point buffers are in ``buffers`` (when the policy casts them; else as they were)."""
    working = copy.deepcopy(module)
    param, buffers = dtype(policy.param), dtype(policy.buffers)
    with torch.no_grad():
        for sub in working.modules():
            for value in sub._parameters.values():
                if value is not None and value.is_floating_point():
                    value.data = value.data.to(param)
            if buffers is None:
                continue
            for name, value in sub._buffers.items():
                if value is not None and value.is_floating_point():
                    sub._buffers[name] = value.to(buffers)
    return working


def install_casts(working: nn.Module, units: Iterable[nn.Module], policy: PrecisionPolicy) -> None:
    """Hooks on ``working`` (the root) and on ``units`` that cast inputs and outputs where the
    candidate's FSDP casts them (``units``: the modules it wraps, besides the root)."""
    param, output = dtype(policy.param), dtype(policy.output)
    wrapped = [working, *units]
    casting_inputs = {"root": [working], "units": wrapped, "none": []}[policy.inputs]

    def cast_inputs(module: nn.Module, args: Any, kwargs: Any) -> tuple[Any, Any]:
        return _cast_floats(args, param), _cast_floats(kwargs, param)  # type: ignore[arg-type]

    def cast_output(module: nn.Module, args: Any, result: Any) -> Any:
        return _cast_floats(result, output)  # type: ignore[arg-type]

    for module in casting_inputs:
        module.register_forward_pre_hook(cast_inputs, prepend=True, with_kwargs=True)
    if output is not None:
        for module in wrapped:
            module.register_forward_hook(cast_output)


def _predivide(world: int) -> int:
    """The smallest power of two ``f`` with ``f * f >= world`` among the divisors of ``world``:
    torch's ``_get_gradient_predivide_factor`` (FSDP1) and ``_get_gradient_divide_factors`` (FSDP2),
    which both divide by about the square root of the world size before the sum."""
    factor = 1
    while world % factor == 0 and world / factor > factor:
        factor *= 2
    return factor


def divide_factors(engine: str, reduce: torch.dtype, world: int) -> tuple[float | None, float | None]:
    """What the candidate ``engine`` divides its summed gradients by, before and after the sum.

    FSDP1 always splits the world size (``pre * post == world``, ``pre`` about its square root;
    HYBRID_SHARD counts both mesh dimensions). FSDP2 does so only where it fears overflow (a reduce
    dtype other than float32 and bfloat16); else it reduces with ``ReduceOp.AVG``: sum, then
    divide by the world size. DDP divides by all of it before the sum. Why it matters: at world
    size 4 FSDP sums halves in float16 where DDP sums quarters, and a sum of halves overflows
    first, so a reference dividing as DDP does skips fewer steps than its candidate. A user's
    function (``user``) is mirrored as FSDP2 divides by default: a factor the function set by hand
    (``set_gradient_divide_factor``) is the candidate's, not the truth's."""
    if engine == "user":
        engine = "fsdp2"
    if engine == "fsdp1" or (engine == "fsdp2" and reduce not in (torch.float32, torch.bfloat16)):
        pre = _predivide(world)
        return float(pre), world / pre
    if engine == "fsdp2":
        return None, float(world)
    return float(world), None


def reduce_grads(
    lows: list[nn.Parameter],
    masters: list[nn.Parameter],
    policy: PrecisionPolicy,
    factors: tuple[float | None, float | None],
    layout: reduce_layout.Layout,
    *,
    in_reverse: bool = False,
) -> None:
    """Average the working copy's gradients over the ranks in ``reduce`` as the candidate does
    (``layout``: its collectives and buffers; ``factors``: before, after the sum; ``in_reverse``:
    the ranks summed in reverse order instead, ``reduce_layout.reduce``) and hand them to the
    masters in float32, or in ``param`` under ``keep_low_precision_grads``."""
    grads: list[torch.Tensor | None] = [low.grad for low in lows]
    if all(grad is None for grad in grads):
        return
    for low in lows:  # the list holds them now, and lets each go once it is reduced
        low.grad = None
    reduced = reduce_layout.reduce(
        layout,
        list(lows),
        grads,
        DTYPES[policy.reduce_dtype],  # type: ignore[index]
        factors,
        in_reverse=in_reverse,
        consume=True,
    )
    for master, grad in zip(masters, reduced, strict=True):
        if grad is None:
            continue
        if policy.keep_low_precision_grads:
            # FSDP1 hands the optimizer low-precision grads on float32 parameters (through .data,
            # as FSDP does: an assignment to .grad refuses another dtype).
            master.grad = torch.empty_like(master)
            master.grad.data = grad.to(DTYPES[policy.param])
        else:
            master.grad = grad.to(master.dtype)


# -- FSDP2's autograd structure ---------------------------------------------------------------------
class _PassThrough(torch.autograd.Function):
    """The identity, as one autograd node over several tensors (FSDP2's
    ``RegisterPostBackwardFunction`` without the post-backward it triggers)."""

    @staticmethod
    def forward(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        return inputs

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        return grads


def mirror_fsdp2_inputs(root: nn.Module, units: Iterable[nn.Module]) -> None:
    """Route each wrapped module's grad-requiring inputs through one identity autograd node per
    call, after the input casts, as FSDP2's ``pre_forward`` does (``_register_post_backward_hook``).

    Why it matters: a tensor that several units receive (T5 hands the relative position bias
    made in its first block to every later block) then sums its gradient from each unit as one
    node's output, in backward order; without the node autograd sums the same terms in another
    order, and the last bits of the gradients differ even in float32."""
    from harness.torch_private import fsdp2

    def pass_through(module: nn.Module, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        if not torch.is_grad_enabled():
            return None
        tensors = fsdp2.grad_tensors((args, kwargs))
        if not tensors:
            return None
        return fsdp2.replace_grad_tensors((args, kwargs), iter(_PassThrough.apply(*tensors)))

    for module in (root, *units):
        if any(True for _ in module.parameters()):  # FSDP2 makes a parameter group only for these
            module.register_forward_pre_hook(pass_through, with_kwargs=True)
