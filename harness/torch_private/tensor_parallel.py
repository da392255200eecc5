"""Tensor parallelism internals the harness reads: which ``ParallelStyle`` a user's function
applied to which module, over which mesh.

Read from torch 2.11, 2.12, 2.13 and 2.14 (``torch/distributed/tensor/parallel/style.py``): every
style applies itself through ``ParallelStyle._apply(module, device_mesh)``, and
``parallelize_module`` calls it. A style leaves no trace on the module (a ``SequenceParallel`` norm
looks like a replicated one), so the only way to know is to record the calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def recording_styles(into: list[tuple[Any, Any, Any]]) -> Iterator[None]:
    """Record ``(module, style, mesh)`` for every ``ParallelStyle`` applied inside (each style
    class's ``_apply`` wrapped); the classes are restored on exit."""
    from torch.distributed.tensor.parallel import style as styles

    classes = [
        c for c in vars(styles).values() if isinstance(c, type) and issubclass(c, styles.ParallelStyle)
    ]
    saved = {c: c.__dict__["_apply"] for c in classes if "_apply" in c.__dict__}

    def recorder(original: Any) -> Any:
        def _apply(self: Any, module: Any, device_mesh: Any) -> Any:
            into.append((module, self, device_mesh))
            return original(self, module, device_mesh)

        return _apply

    try:
        for cls, original in saved.items():
            cls._apply = recorder(original)  # type: ignore[method-assign]
        yield
    finally:
        for cls, original in saved.items():
            cls._apply = original  # type: ignore[method-assign]
