"""``torch.compile`` of the model (rank side), on both sides of a configuration.

The reference is the candidate's unsharded twin: it keeps what may legitimately change the numbers,
and compiling does (inductor generates kernels that fuse and round otherwise than eager ops). So
both sides compile the same modules with the same backend (``config.compile``): per block, every
innermost FSDP unit (a unit that holds no other unit: the blocks the candidate shards); or the
whole trained module. Why innermost only: a unit around other units (the MLP's ``inner``) would
trace its sub-units' FSDP hooks into its graph on one side and plain modules on the other; the
blocks are what torchtitan and FSDP users compile.

``module.compile()`` compiles the module's call in place, so every parameter keeps its name and
FSDP1's wrappers and FSDP2's ``fully_shard`` (applied already, by the engine) call the compiled
module. Compiling is lazy: the first step pays for it, which the run measures (``train.Run``,
``compile_s``).

Three settings are the process's own (dynamo's state is global in a rank that runs many rows):

* static shapes (``automatic_dynamic_shapes=False``): every module call shares the code object of
  ``nn.Module._call_impl``, so a second block width would otherwise turn a graph dynamic on one
  side and not the other;
* a recompile limit that rows cannot reach, and reaching it raises instead of running eager
  silently (a "compiled" row that ran eager would be a lie);
* inductor's caches (FX graph, AOT autograd) in one folder every rank and every run sees
  (``plan.config.compile.cache_folder``): the reference and the candidate compile the same graphs,
  and the second compile of a graph is a cache hit.
"""

from __future__ import annotations

import os

from torch import nn

from harness.parity.plan.config import ParityConfig
from harness.parity.plan.config.compile import CACHE_ENV, cache_folder
from harness.parity.ranks.sides import engines
from harness.torch_private import dynamo

RECOMPILE_LIMIT = 512
"""Graphs per code object (every module's ``_call_impl`` shares one) before dynamo gives up."""


def settle() -> None:
    """The process-wide settings of a compiled run (the module docstring says why)."""
    os.environ.setdefault(CACHE_ENV, cache_folder())
    dynamo.settle(RECOMPILE_LIMIT)


def blocks(model: nn.Module, classes: tuple[type[nn.Module], ...]) -> list[nn.Module]:
    """The innermost units of ``model``: every unit module that holds no other unit."""
    found = engines.unit_modules(model, classes)
    return [u for u in found if not any(isinstance(m, classes) for m in u.modules() if m is not u)]


def targets(
    model: nn.Module, classes: tuple[type[nn.Module], ...], mode: str, *, workload: str
) -> list[nn.Module]:
    """The modules ``mode`` compiles: the blocks, or the model itself."""
    if mode == "whole":
        return [model]
    found = blocks(model, classes)
    if not found:
        raise ValueError(
            f"compile='block' compiles the FSDP units; workload {workload!r} has none "
            "(set Workload.units, or compile='whole')"
        )
    return found


def apply(modules: list[nn.Module], *, backend: str) -> None:
    """``module.compile(backend=backend)`` on each of ``modules``, in place."""
    for module in modules:
        module.compile(backend=backend)


def compiled_modules(model: nn.Module) -> int:
    """How many modules of ``model`` (itself included) will run compiled: read off the modules, so a
    side that was left eager says so whatever it was asked to do."""
    return sum(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules())


def install(engine: engines.Engine, config: ParityConfig, role: str) -> None:
    """Compile ``engine``'s trained module as ``config.compile`` says, on either ``role`` (the
    training loop calls it once the engine is built and wrapped, as ``checkpoint.install``)."""
    part = config.compile
    if part.mode is None or part.mode == "function":  # a user's function compiles itself (``user/``)
        return
    settle()
    if role == "reference" and part.twin == "eager":
        engine.description += ", eager (its candidate compiled: compile's own difference shows)"
        return
    model = engine.trained_module()
    chosen = targets(model, engine.units, part.mode, workload=config.workload)
    apply(chosen, backend=part.backend)
    what = "whole model" if part.mode == "whole" else f"{len(chosen)} blocks"
    engine.description += f", {what} compiled ({part.backend})"


def count(engine: engines.Engine | None) -> int:
    """How many modules of ``engine``'s trained module run compiled (0: none, or no engine yet)."""
    if engine is not None and engine.compiled_count is not None:
        return engine.compiled_count
    return 0 if engine is None else compiled_modules(engine.trained_module())


def recorded(engine: engines.Engine, config: ParityConfig) -> str | None:
    """What a step records of it, read off the modules: ``3 modules, inductor`` (``None``: none
    runs compiled, whatever the configuration asked)."""
    found = count(engine)
    backend = engine.compile_backend or config.compile.backend
    return f"{found} module{'s' if found != 1 else ''}, {backend}" if found else None
