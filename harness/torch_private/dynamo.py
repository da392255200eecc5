"""``torch.compile`` internals the harness reads and sets: dynamo's settings for a warm rank, what
a compiled module was compiled with, and inductor's default cache folder.

Read from torch 2.11, 2.12, 2.13 and 2.14 (``torch/_dynamo/config.py``, ``eval_frame.py``,
``torch/_inductor/runtime/cache_dir_utils.py``): the same.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any


def settle(recompile_limit: int) -> None:
    """A warm rank's dynamo settings: no automatic dynamic shapes, at least ``recompile_limit``
    graphs per code object, and an error (not a silent fallback to eager) past it."""
    import torch._dynamo

    config = torch._dynamo.config
    config.automatic_dynamic_shapes = False
    config.recompile_limit = max(config.recompile_limit, recompile_limit)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, recompile_limit)
    config.fail_on_recompile_limit_hit = True


def optimized_module_class() -> type:
    """``OptimizedModule``: what ``torch.compile(module)`` returns."""
    from torch._dynamo.eval_frame import OptimizedModule

    return OptimizedModule


def original_module(module: Any) -> Any:
    """The module a ``torch.compile(module)`` wraps (``_orig_mod``), or ``module`` itself."""
    return module._orig_mod if isinstance(module, optimized_module_class()) else module


@dataclasses.dataclass(frozen=True, slots=True)
class CompiledWith:
    """How a module was compiled, read from dynamo's context."""

    backend: Any
    """The backend as the user passed it (a name's compiler function, or their callable)."""
    fullgraph: bool
    dynamic: Any
    how: str
    """``torch.compile(module)`` or ``module.compile()``."""


def compiled_with(module: Any) -> CompiledWith | None:
    """How ``module`` was compiled (``None``: it was not): an ``OptimizedModule``'s
    ``dynamo_ctx``, or the context a ``module.compile()`` left in ``_compiled_call_impl``; the
    backend unwrapped from dynamo's ``ConvertFrame`` and ``WrapBackendDebug``
    (``_torchdynamo_orig_backend``)."""
    if isinstance(module, optimized_module_class()):
        ctx, how = module.dynamo_ctx, "torch.compile(module)"
    else:
        impl = getattr(module, "_compiled_call_impl", None)
        if impl is None:
            return None
        ctx, how = inspect.getclosurevars(impl).nonlocals.get("self"), "module.compile()"
    backend = ctx.callback._torchdynamo_orig_backend  # ConvertFrame
    backend = getattr(backend, "_torchdynamo_orig_backend", backend)  # WrapBackendDebug
    backend = getattr(backend, "_torchdynamo_orig_backend", backend)
    return CompiledWith(backend=backend, fullgraph=bool(ctx.fullgraph), dynamic=ctx._dynamic, how=how)


def inductor_cache_dir() -> str:
    """inductor's own default cache folder (``torchinductor_<user>`` in the temporary folder)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return default_cache_dir()
