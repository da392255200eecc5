"""A candidate's local gradients as they enter its reduction (rank side): the staged check's first stage.

Why here: a sharded engine never exposes its unreduced gradients; the first thing it does with
them is reduce them. The staged check (``ranks/staged.py``) needs them to tell a compute mismatch
(a module that runs otherwise when wrapped: the local gradients differ) from a reduction that sums
in another order (they match, the reduced ones differ within the order-free bound). So for one
backward this wraps the function FSDP hands them to, records a copy of each parameter's
gradient by its name in the user's model, and calls the original, which reduces as usual:

* **FSDP2**: ``foreach_reduce(fsdp_params, unsharded_grads, ...)`` of ``_fsdp_param_group`` (every
  reduce-scatter of a ``fully_shard`` group goes through it, whatever its collective, a custom
  ``set_custom_reduce_scatter`` included); each gradient in the compute dtype, by
  ``FSDPParam._param_fqn``.
* **FSDP1**: ``_reduce_grad`` / ``_reduce_grad_no_shard`` of ``_runtime_utils``: the unit's flat
  gradient (already cast to the policy's reduce dtype), split by the flat parameter's own
  metadata (``_fqns``, ``_shapes``, ``_numels_with_padding``, ``_is_padding_mask``) and prefixed
  with the unit's name.

The sites and the layout are read through ``harness/torch_private`` (``fsdp2``, ``fsdp1``), which
names the torch versions they were read from; only names and layout are read, never a
value FSDP derives (a divide factor, a dtype choice). DDP's reducer runs in C++ and is not observed
(``None``).

**Why a patch, and the one place it is made.** torch offers no hook that sees a sharded engine's
gradients before it reduces them without taking over the reduction: FSDP2's
``set_custom_reduce_scatter`` is handed the gradients already copied into one padded buffer and is
the candidate's own slot (a user's or a planted reduce-scatter sits there, and torch has no getter
to chain to it); FSDP1's ``register_comm_hook`` replaces the reduction itself, once, before training;
the parameters a user holds get their gradients from FSDP after the reduction (the unreduced ones
accumulate on FSDP's own unsharded parameters), so their gradient hooks come too late; module
backward hooks see activations' gradients. So for one backward ``torch_private.patches.patched`` replaces each
function of :data:`PATCH_SITES` in its torch module and puts it back: the engine replaces no other
function of torch. Each site states the parameters the recording takes, the caller that looks
the function up by its module-level name at call time (what makes the replacement reach FSDP), and
where torch sets the private attributes read; :func:`torch_differs` checks every one against the
installed torch, and ``suites/parity/test_capture.py`` fails naming what changed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from harness.parity.ranks.sides import engines
from harness.parity.ranks.sides.full import gather
from harness.torch_private import fsdp1, fsdp2, patches

PATCH_SITES = (fsdp2.REDUCE, *fsdp1.REDUCE)
"""Every torch function this module replaces (FSDP2's, then FSDP1's two), declared in
``harness/torch_private`` with the torch versions they were read from."""


def torch_differs() -> list[str]:
    """What of :data:`PATCH_SITES` the installed torch no longer has as it was read, one line each
    (empty: every patch still reaches FSDP and reads what it read)."""
    return patches.torch_differs(PATCH_SITES)


@contextlib.contextmanager
def local_grads(engine: engines.Engine) -> Iterator[dict[str, list[torch.Tensor]] | None]:
    """Inside the block, each gradient ``engine`` reduces is copied into the yielded dict (by name
    as in the user's model; one entry per reduction, in order: an accumulation that reduces every
    microbatch reduces each parameter once per microbatch); ``None`` for an engine whose reduction
    cannot be observed."""
    if isinstance(engine, engines.FSDP2):
        with _fsdp2(engine) as found:
            yield found
    elif isinstance(engine, engines.FSDP1):
        with _fsdp1(engine) as found:
            yield found
    else:
        yield None


@contextlib.contextmanager
def _fsdp2(engine: engines.Engine) -> Iterator[dict[str, list[torch.Tensor]]]:
    found: dict[str, list[torch.Tensor]] = {}
    # Named by the module that holds each parameter, not by FSDP's ``_param_fqn``: that is relative
    # to whichever module is FSDP's root, which a user's function may leave unsharded.
    modules = {id(m): n for n, m in reversed(list(engine.module.named_modules(remove_duplicate=False)))}

    def name_of(fsdp_param: Any) -> str:
        module, name = fsdp2.param_owner(fsdp_param)
        return gather.clean_name(f"{modules[id(module)]}.{name}".lstrip("."))

    def recording(original: Any) -> Any:
        def record(
            fsdp_params: list[Any], unsharded_grads: list[torch.Tensor], *args: Any, **kwargs: Any
        ) -> Any:
            for fsdp_param, grad in zip(fsdp_params, unsharded_grads, strict=True):
                found.setdefault(name_of(fsdp_param), []).append(grad.detach().clone())
            return original(fsdp_params, unsharded_grads, *args, **kwargs)

        return record

    with patches.patched(fsdp2.REDUCE, recording):
        yield found


def _split_flat(flat: torch.Tensor, flat_param: Any, prefix: str) -> dict[str, torch.Tensor]:
    """A unit's flat gradient as its parameters' gradients (padding between them dropped)."""
    out: dict[str, torch.Tensor] = {}
    layout = fsdp1.layout(flat_param)
    names = iter(zip(layout.names, layout.shapes, strict=True))
    offset = 0
    for numel, padding in zip(layout.numels_with_padding, layout.is_padding, strict=True):
        if not padding:
            name, shape = next(names)
            out[gather.clean_name(prefix + name)] = flat[offset : offset + numel].view(shape).clone()
        offset += numel
    return out


@contextlib.contextmanager
def _fsdp1(engine: engines.Engine) -> Iterator[dict[str, list[torch.Tensor]]]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    prefixes = {
        module: (gather.clean_name(name) + "." if name else "")
        for name, module in engine.wrapped.named_modules()
        if isinstance(module, FSDP)
    }
    found: dict[str, list[torch.Tensor]] = {}

    def recording(original: Any) -> Any:
        def record(state: Any, handle: Any) -> Any:
            flat = handle.flat_param.grad.detach()
            for param, grad in _split_flat(flat, handle.flat_param, prefixes.get(state, "")).items():
                found.setdefault(param, []).append(grad)
            return original(state, handle)

        return record

    with contextlib.ExitStack() as stack:
        for site in fsdp1.REDUCE:
            stack.enter_context(patches.patched(site, recording))
        yield found
