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

Read from torch 2.13's sources (:data:`TORCH_READ`); only names and layout are read here, never a
value FSDP derives (a divide factor, a dtype choice). DDP's reducer runs in C++ and is not observed
(``None``).

**Why a patch, and the one place it is made.** torch offers no hook that sees a sharded engine's
gradients before it reduces them without taking over the reduction: FSDP2's
``set_custom_reduce_scatter`` is handed the gradients already copied into one padded buffer and is
the candidate's own slot (a user's or a planted reduce-scatter sits there, and torch has no getter
to chain to it); FSDP1's ``register_comm_hook`` replaces the reduction itself, once, before training;
the parameters a user holds get their gradients from FSDP after the reduction (the unreduced ones
accumulate on FSDP's own unsharded parameters), so their gradient hooks come too late; module
backward hooks see activations' gradients. So for one backward :func:`_patched` replaces each
function of :data:`PATCH_SITES` in its torch module and puts it back: the engine replaces no other
function of torch. Each site states the parameters the recording takes, the caller that looks
the function up by its module-level name at call time (what makes the replacement reach FSDP), and
where torch sets the private attributes read; :func:`torch_differs` checks every one against the
installed torch, and ``suites/parity/test_capture.py`` fails naming what changed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

from harness.parity.ranks.sides import engines
from harness.parity.ranks.sides.full import gather

TORCH_READ = "2.13"
"""The torch version whose sources every patch site here was read from."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PatchSite:
    """One private torch function replaced for the length of one backward (module docstring)."""

    module: str
    name: str
    parameters: tuple[str, ...]
    """Its leading parameters, which the recording takes by position."""
    called_from: str
    """The function of ``module`` (``Class.method`` or a function) that calls it by its module-level
    name when FSDP reduces: replacing the module's attribute reaches FSDP only so."""
    reads: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    """The private attributes the recording reads: ``(module, function that sets them, names)``."""


_FSDP1_READS = (
    (
        "torch.distributed.fsdp._flat_param",
        "FlatParameter._init_metadata",
        ("_fqns", "_shapes", "_numels_with_padding", "_is_padding_mask"),
    ),
)
PATCH_SITES = (
    PatchSite(
        module="torch.distributed.fsdp._fully_shard._fsdp_param_group",
        name="foreach_reduce",
        parameters=("fsdp_params", "unsharded_grads"),
        called_from="FSDPParamGroup.post_backward",
        reads=(("torch.distributed.fsdp._fully_shard._fsdp_param", "FSDPParam.__init__", ("_param_fqn",)),),
    ),
    PatchSite(
        module="torch.distributed.fsdp._runtime_utils",
        name="_reduce_grad",
        parameters=("state", "handle"),
        called_from="_post_backward_hook",
        reads=_FSDP1_READS,
    ),
    PatchSite(
        module="torch.distributed.fsdp._runtime_utils",
        name="_reduce_grad_no_shard",
        parameters=("state", "handle"),
        called_from="_post_backward_hook",
        reads=_FSDP1_READS,
    ),
)
"""Every torch function this module replaces (FSDP2's, then FSDP1's two), as read in torch
:data:`TORCH_READ`."""


def _attribute(module: str, dotted: str) -> Any:
    found: Any = importlib.import_module(module)
    for part in dotted.split("."):
        found = getattr(found, part)
    return found


def _names_used(function: Any) -> set[str]:
    """The global and attribute names ``function``'s own code uses (decorators unwrapped)."""
    return set(inspect.unwrap(function).__code__.co_names)


def torch_differs() -> list[str]:
    """What of :data:`PATCH_SITES` the installed torch no longer has as torch :data:`TORCH_READ`
    had it, one line each (empty: every patch still reaches FSDP and reads what it read)."""
    found: list[str] = []
    for site in PATCH_SITES:
        where = f"{site.module}.{site.name} (read in torch {TORCH_READ}, installed {torch.__version__})"
        try:
            function = _attribute(site.module, site.name)
            caller = _attribute(site.module, site.called_from)
        except (ImportError, AttributeError) as error:
            found.append(f"{where}: {error}")
            continue
        parameters = tuple(inspect.signature(function).parameters)[: len(site.parameters)]
        if parameters != site.parameters:
            found.append(f"{where}: its parameters begin {parameters}, the recording takes {site.parameters}")
        if site.name not in _names_used(caller):
            found.append(
                f"{where}: {site.called_from} no longer calls it by name; the patch would not be reached"
            )
        for module, setter, names in site.reads:
            try:
                missing = sorted(set(names) - _names_used(_attribute(module, setter)))
            except (ImportError, AttributeError) as error:
                found.append(f"{where}: {error}")
                continue
            if missing:
                found.append(
                    f"{where}: {module}.{setter} no longer sets {missing}, which the recording reads"
                )
    return found


@contextlib.contextmanager
def _patched(site: PatchSite, replacement: Callable[[Any], Any]) -> Iterator[None]:
    """``site``'s function replaced by ``replacement(original)`` inside the block, put back after:
    the one place the engine writes to torch."""
    module = importlib.import_module(site.module)
    original = getattr(module, site.name)
    setattr(module, site.name, replacement(original))
    try:
        yield
    finally:
        setattr(module, site.name, original)


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
        info = fsdp_param._module_info
        return gather.clean_name(f"{modules[id(info.module)]}.{info.param_name}".lstrip("."))

    def recording(original: Any) -> Any:
        def record(
            fsdp_params: list[Any], unsharded_grads: list[torch.Tensor], *args: Any, **kwargs: Any
        ) -> Any:
            for fsdp_param, grad in zip(fsdp_params, unsharded_grads, strict=True):
                found.setdefault(name_of(fsdp_param), []).append(grad.detach().clone())
            return original(fsdp_params, unsharded_grads, *args, **kwargs)

        return record

    with _patched(PATCH_SITES[0], recording):
        yield found


def _split_flat(flat: torch.Tensor, flat_param: Any, prefix: str) -> dict[str, torch.Tensor]:
    """A unit's flat gradient as its parameters' gradients (padding between them dropped)."""
    out: dict[str, torch.Tensor] = {}
    names = iter(zip(flat_param._fqns, flat_param._shapes, strict=True))
    offset = 0
    for numel, padding in zip(flat_param._numels_with_padding, flat_param._is_padding_mask, strict=True):
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
        for site in PATCH_SITES[1:]:
            stack.enter_context(_patched(site, recording))
        yield found
