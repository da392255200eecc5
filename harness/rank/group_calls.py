"""``dist.init_process_group``/``destroy_process_group`` called by a test, absorbed by the warm
group (rank side, only while a ``DistributedTestCase`` test runs).

Why: ``MultiProcessTestCase`` tests build their own default group in every test method (file or
TCP store) and destroy it at the end. On the warm pool the group already exists, with this rank
and world size; building another would fail ("trying to initialize the default process group
twice") and destroying it would cost a rebuild per test. So, while the test runs:

* ``init_process_group(...)`` with this rank's backend, rank and world size (or without them) is
  absorbed: it returns as if it had built the group. Any other world size, rank or backend is a
  ``ValueError`` naming the test's value and the class's, because the test would otherwise run in
  a world it did not ask for. ``store``, ``init_method`` and ``timeout`` are ignored;
* ``destroy_process_group()`` of the default group is absorbed; of any other group it is real.

Calls made by the harness itself (``harness.*`` modules: the rank rebuilding the group, subtests
leaving it) go to torch unchanged, so a group reset inside a test still happens. Both names are
patched, ``torch.distributed.X`` and ``torch.distributed.distributed_c10d.X``, and restored when the
test ends; a reference taken before (``from torch.distributed import init_process_group`` at module
level) is torch's own function and is not absorbed.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Callable, Iterator
from typing import Any

from harness.rank import context

_NAMES = ("init_process_group", "destroy_process_group")


def _called_by_harness() -> bool:
    caller = sys._getframe(2).f_globals.get("__name__", "")
    return caller == "harness" or caller.startswith("harness.")


def _backends(backend: Any) -> set[str]:
    """The backend names in ``backend``: ``"gloo"``, ``Backend.GLOO``, ``"cpu:gloo,cuda:nccl"``."""
    text = str(getattr(backend, "value", backend)).lower()
    return {part.rsplit(":", 1)[-1].strip() for part in text.split(",") if part.strip()}


def _check_init(
    arguments: dict[str, Any], *, test_id: str, class_name: str, ctx: context.RankContext
) -> None:
    world_size, rank, backend = arguments["world_size"], arguments["rank"], arguments["backend"]
    if world_size not in (-1, None) and world_size != ctx.world_size:
        raise ValueError(
            f"{test_id} calls dist.init_process_group(world_size={world_size}) but {class_name}.world_size "
            f"is {ctx.world_size}: the warm pool runs the class's tests on {ctx.world_size} ranks; set "
            f"world_size = {world_size} on the class (or pass world_size=self.world_size)"
        )
    if rank not in (-1, None) and rank != ctx.rank:
        raise ValueError(
            f"{test_id} calls dist.init_process_group(rank={rank}) on rank {ctx.rank}; pass rank=self.rank"
        )
    if backend is not None and ctx.backend not in _backends(backend):
        raise ValueError(
            f"{test_id} calls dist.init_process_group(backend={str(backend)!r}) but {class_name}.backend is "
            f"{ctx.backend!r}; set backend = {str(backend)!r} on the class (or pass backend=self.backend)"
        )


@contextlib.contextmanager
def absorbed(*, test_id: str, class_name: str, ctx: context.RankContext) -> Iterator[None]:
    """Patch the two functions for the duration of one test (see the module docstring)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    saved = {(module, name): getattr(module, name) for module in (dist, c10d) for name in _NAMES}
    real_init: Callable[..., Any] = c10d.init_process_group
    real_destroy: Callable[..., Any] = c10d.destroy_process_group
    signature = inspect.signature(real_init)

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        if _called_by_harness():
            return real_init(*args, **kwargs)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"dist.init_process_group{signature}: {exc}") from None
        bound.apply_defaults()
        _check_init(bound.arguments, test_id=test_id, class_name=class_name, ctx=ctx)
        return None

    def destroy_process_group(group: Any = None) -> None:
        if _called_by_harness() or (group is not None and group is not c10d.GroupMember.WORLD):
            return real_destroy(group)
        return None

    init_process_group.__wrapped__ = real_init  # type: ignore[attr-defined]
    destroy_process_group.__wrapped__ = real_destroy  # type: ignore[attr-defined]
    replacements = {"init_process_group": init_process_group, "destroy_process_group": destroy_process_group}
    for module, name in saved:
        setattr(module, name, replacements[name])
    try:
        yield
    finally:
        for (module, name), original in saved.items():
            setattr(module, name, original)
