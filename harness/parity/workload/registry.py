"""Finding workloads by name, checking them, and drawing their weights and data deterministically.

A workload is named by a ``module:function`` spec (a module-level factory without arguments that
returns a :class:`~harness.parity.Workload`), or by a registered name: the built-ins below, or an
entry point of the ``shardscale.workloads`` group, which any installed package can declare::

    [project.entry-points."shardscale.workloads"]
    resmlp = "my_package.parity:resmlp"

Every name resolves to a spec and every spec through :func:`resolve`: one code path for ours and
the user's. Ranks resolve the spec themselves (it is all a ``ParityConfig`` carries), so the
module must import from the rank's ``sys.path`` (the controller's, which the pool passes on).

Determinism: the model is built under ``torch.manual_seed(seed)`` (same weights on every rank);
``batch(rank, step)`` runs with torch's global RNG seeded by :func:`batch_seed`, and each forward
with another seed of the same ``(seed, rank, step)``, so dropout draws the same masks in the
reference and the candidate. Importing this module imports no torch.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from harness.parity.workload.spec import Workload, WorkloadError

if TYPE_CHECKING:  # pragma: no cover - annotations only
    import torch
    from torch import nn

ENTRY_POINT_GROUP = "shardscale.workloads"
BUILTIN = {
    "mlp": "harness.parity.workload.builtin.toys:mlp",
    "transformer": "harness.parity.workload.builtin.toys:transformer",
    "frozen": "harness.parity.workload.builtin.toys:frozen",
    "embedding": "harness.parity.workload.builtin.toys:embedding",
    "llama": "harness.parity.workload.builtin.llama:llama",
    "convnet": "harness.parity.workload.builtin.convnet:convnet",
    "uneven": "harness.parity.workload.builtin.uneven:uneven",
    "canary": "harness.parity.workload.builtin.canary:canary",
}
"""Built-in names and their factories (resolved like any user's spec)."""

OVERFLOW_STEP = 3
"""The step of the ``embedding`` workload whose duplicated indices overflow once coalesced."""
OVERFLOW_INDEX = 5
"""The index every rank repeats three times in that step."""


# -- names -----------------------------------------------------------------------------------------
def entry_points() -> dict[str, tuple[str, str]]:
    """``{name: (spec, distribution)}`` of the ``shardscale.workloads`` entry points installed."""
    from importlib import metadata

    found = {}
    for point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(point, "dist", None)
        found[point.name] = (point.value, dist.name if dist is not None else "?")
    return found


def available() -> dict[str, tuple[str, str]]:
    """``{name: (spec, where it comes from)}``: the built-ins, then installed entry points (a
    built-in name cannot be taken over)."""
    names = {name: (spec, "built-in") for name, spec in BUILTIN.items()}
    for name, (spec, dist) in entry_points().items():
        names.setdefault(name, (spec, f"entry point of {dist}"))
    return names


def spec_of(workload: str | Callable[[], Workload]) -> str:
    """The spec of a name, a spec, or a module-level factory function (``module:qualname``)."""
    if callable(workload):
        qualname = getattr(workload, "__qualname__", "")
        if not qualname or "<" in qualname or "." in qualname:
            raise WorkloadError(
                f"{workload!r} is not a module-level function; ranks import the factory by name, "
                "so define it at the top level of a module"
            )
        return f"{workload.__module__}:{qualname}"
    if not isinstance(workload, str) or not workload:
        raise WorkloadError(f"a workload is a name or 'module:function', got {workload!r}")
    if ":" in workload:
        return workload
    if workload in BUILTIN:
        # A built-in name cannot be taken over, so it needs no scan of the installed entry points
        # (importlib.metadata reads every distribution's metadata: seconds, paid per test otherwise).
        return BUILTIN[workload]
    known = available()
    if workload not in known:
        raise WorkloadError(
            f"unknown workload {workload!r}: give 'module:function' (a factory returning a Workload) "
            f"or one of the registered names {sorted(known)}"
        )
    return known[workload][0]


def get(name_or_spec: str | Callable[[], Workload]) -> Workload:
    """The workload of a registered name or a ``module:function`` spec (resolved once per process)."""
    return resolve(spec_of(name_or_spec))


def raised(what: str) -> str:
    """``what``, then the traceback of the exception being handled, without this package's and
    importlib's frames: the user's code is what the reader must see."""
    error = sys.exc_info()[1]
    assert error is not None, "raised() is for an except block"
    summary = traceback.TracebackException.from_exception(error)
    here = os.path.dirname(os.path.abspath(__file__))
    summary.stack = traceback.StackSummary.from_list(
        [
            f
            for f in summary.stack
            if not f.filename.startswith((here, "<frozen")) and "importlib" not in f.filename
        ]
    )
    return f"{what}:\n" + "".join(summary.format()).rstrip()


@functools.cache
def resolve(spec: str) -> Workload:
    """Import ``module`` of ``module:function``, call the factory and check what it returns.

    Every failure is a :class:`WorkloadError` whose message says what to fix."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise WorkloadError(f"workload {spec!r} must look like 'module:function' (e.g. my_workloads:resmlp)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        if getattr(error, "name", None) == module_name:
            raise WorkloadError(
                f"workload {spec!r}: no module named {module_name!r}; run from the folder that holds "
                f"{module_name.replace('.', '/')}.py, add that folder to PYTHONPATH, or install its package"
            ) from None
        raise WorkloadError(raised(f"workload {spec!r}: importing {module_name!r} failed")) from None
    except Exception:  # noqa: BLE001 - the user's module raised while importing: say so
        raise WorkloadError(raised(f"workload {spec!r}: importing {module_name!r} raised")) from None
    factory: Any = module
    for part in attribute.split("."):
        if not hasattr(factory, part):
            public = sorted(
                n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")
            )
            raise WorkloadError(
                f"workload {spec!r}: module {module_name!r} has no attribute {attribute!r}; "
                f"its functions are {public}"
            )
        factory = getattr(factory, part)
    if not callable(factory):
        raise WorkloadError(
            f"workload {spec!r}: {attribute} is a {type(factory).__name__}, not a factory function"
        )
    try:
        workload = factory()
    except WorkloadError as error:
        raise WorkloadError(f"workload {spec!r}: {error}") from None
    except Exception:  # noqa: BLE001 - the user's factory raised: show where
        raise WorkloadError(raised(f"workload {spec!r}: calling {attribute}() raised")) from None
    if not isinstance(workload, Workload):
        raise WorkloadError(
            f"workload {spec!r}: {attribute}() returned {type(workload).__name__}, not a Workload; "
            "return harness.parity.Workload(name=..., model=..., batch=..., loss=..., units=...)"
        )
    return workload


# -- seeds ---------------------------------------------------------------------------------------
def batch_seed(seed: int, rank: int, step: int) -> int:
    """The seed of one rank's batch of one step (distinct for every ``(seed, rank, step)``)."""
    return 1_000_003 * seed + 10_007 * rank + step


def forward_seed(seed: int, rank: int, step: int) -> int:
    """The seed torch's RNG holds when one rank's forward of one step starts (dropout)."""
    return 2**40 + batch_seed(seed, rank, step)


@contextlib.contextmanager
def seeded(seed_value: int, device: torch.device | None = None) -> Iterator[None]:
    """torch's RNG (the CPU's, and ``device``'s if it is an accelerator) seeded with
    ``seed_value`` inside, restored afterwards: what a workload draws cannot shift any other draw.

    The generators are seeded one by one: ``torch.manual_seed`` visits every device backend and
    costs ~35 times as much, twice per step of every run."""
    import torch

    cpu = torch.random.default_generator
    accelerator = device is not None and device.type != "cpu"
    saved = cpu.get_state()
    saved_device = torch.get_device_module(device.type).get_rng_state(device) if accelerator else None
    cpu.manual_seed(seed_value)
    if accelerator:
        with torch.get_device_module(device.type).device(device):
            torch.get_device_module(device.type).manual_seed(seed_value)
    try:
        yield
    finally:
        cpu.set_state(saved)
        if accelerator:
            torch.get_device_module(device.type).set_rng_state(saved_device, device)


def make_batch(workload: Workload, seed: int, rank: int, step: int) -> Any:
    """``workload.batch(rank, step)`` with torch's RNG seeded per ``(seed, rank, step)``."""
    with seeded(batch_seed(seed, rank, step)):
        return workload.batch(rank, step)


def build_model(workload: Workload, seed: int) -> nn.Module:
    """The workload's float32 model with weights drawn from ``seed`` (identical on every rank)."""
    with seeded(seed):
        return workload.model()


@functools.cache
def fused_optimizer(spec: str) -> bool:
    """Whether the workload's own optimizer is a fused one (its tolerance profile depends on it)."""
    import torch

    workload = resolve(spec)
    if workload.optimizer is None:
        return False
    with _without_dynamo_disable(torch.optim.Optimizer.add_param_group):
        probe = workload.optimizer([torch.nn.Parameter(torch.zeros(1))])
    return bool(getattr(probe, "defaults", {}).get("fused"))


@contextlib.contextmanager
def _without_dynamo_disable(method: Any) -> Iterator[None]:
    """``method`` (torch's ``_disable_dynamo``-wrapped ``add_param_group``) run as itself for a
    moment. Why: the wrapper imports ``torch._dynamo`` on its first call (1.3-1.6 s here) to build
    its disabled twin, and the controller builds one throwaway optimizer (the probe above) on the
    matrix's critical path and never traces anything. The wrapper looks the twin up on the wrapped
    function (``__dynamo_disable``, torch 2.13's ``_compile.py``); lent the function itself, it
    calls it directly. A torch without that wrapper ignores the loan."""
    inner = getattr(method, "__wrapped__", None)
    if inner is None or hasattr(inner, "__dynamo_disable"):
        yield
        return
    inner.__dynamo_disable = inner
    try:
        yield
    finally:
        del inner.__dynamo_disable
