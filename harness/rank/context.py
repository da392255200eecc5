"""What a test body may ask about the rank it runs on: ``harness.current()``.

Why a module of its own: test bodies run inside rank processes (warm pool or torchrun), and they
need the rank, the world size, the device and a store scoped to the running case without importing
anything of the controller side. The rank side (``rank_main.py``, ``torchrun.py``) sets the
context before each case; nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class GroupKey(Generic[T]):
    """A key of :class:`GroupStash`, typed by what it holds (pytest's ``StashKey``): a module makes
    its own once, at import, and no other module can reach what it keeps."""

    __slots__ = ()


class GroupStash:
    """What the code on this rank keeps for as long as one default process group lives, by
    :class:`GroupKey` (a device mesh of its sub-groups, a reference run whose collectives ran on
    it). A newly created group (:func:`advance_group_generation`) gets an empty stash, so nothing
    kept for a destroyed group is found again, and on every rank alike (:func:`group_generation`).
    """

    __slots__ = ("_values", "generation")

    def __init__(self, generation: int) -> None:
        self.generation = generation
        """Which default process group of this process it belongs to (:func:`group_generation`)."""
        self._values: dict[GroupKey[Any], Any] = {}

    def get(self, key: GroupKey[T]) -> T | None:
        """What ``key`` holds, or ``None``."""
        return self._values.get(key)

    def __setitem__(self, key: GroupKey[T], value: T) -> None:
        self._values[key] = value

    def setdefault(self, key: GroupKey[T], make: Callable[[], T]) -> T:
        """What ``key`` holds, made by ``make()`` and kept the first time."""
        if key not in self._values:
            self._values[key] = make()
        return self._values[key]

    def pop(self, key: GroupKey[T]) -> T | None:
        """Drop what ``key`` holds (``None`` if nothing); what it held."""
        return self._values.pop(key, None)


_CURRENT: RankContext | None = None
_GROUP = GroupStash(0)
_HEARTBEAT: Callable[[], None] | None = None
_HEARTBEAT_EVERY_S = 0.5
_last_beat = 0.0


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RankContext:
    """The rank a case runs on. Set by the rank side; read through :func:`current`."""

    rank: int
    world_size: int
    backend: str
    device: Any
    """``torch.device("cpu")`` for gloo, ``torch.device("cuda", local_rank)`` for NCCL."""
    store: Any
    """A ``torch.distributed.Store`` whose keys are private to the running case."""
    reset_group: Callable[[str], None]
    """Re-create the default process group under a new key suffix (used by subtests after a failure)."""
    mode: str = "pool"
    """``"pool"`` (warm rank pool under pytest) or ``"torchrun"`` (env:// rendezvous)."""


def current() -> RankContext:
    """The context of the rank this code runs on.

    Raises ``RuntimeError`` outside a rank, because a silent default (rank 0 of 1) would let a
    distributed test pass without ever being distributed.
    """
    if _CURRENT is None:
        raise RuntimeError(
            "harness.current() is only available inside a rank; run the function through "
            "@harness.distributed(...) or the `ranks` fixture, or under `python -m harness.frontends.torchrun`"
        )
    return _CURRENT


def in_rank() -> bool:
    """True inside a rank process while a case runs."""
    return _CURRENT is not None


def group_generation() -> int:
    """How many times this process has created the default process group.

    Why a counter and not ``id()`` of the group: a re-created group may reuse a destroyed one's
    address on one rank and not on another, and a cache keyed on it would hit on one rank and miss
    on the other (one rank runs the collectives of a fresh reference, its peer does not). Every
    rank creates its groups together (a new pool group, a reset after an agreement, torchrun's
    first group), so caches keyed on the generation hit or miss on every rank alike."""
    return _GROUP.generation


def group_stash() -> GroupStash:
    """What is kept for the current default process group (:class:`GroupStash`): the one owner of
    what the parity engine keeps from one rank call to the next, dropped with the group."""
    return _GROUP


def advance_group_generation() -> None:
    """Count a newly created default process group (called by every rank side that creates one);
    it starts with an empty :func:`group_stash`."""
    global _GROUP
    _GROUP = GroupStash(_GROUP.generation + 1)


def heartbeat() -> None:
    """Tell the controller this rank's case is making progress (call it once per training step).

    Why: a case's deadline is a hang guard. Each heartbeat restarts the deadline's clock for this
    rank, so a large model whose steps are slow but steady is never taken for a hung one, while a
    rank stuck in a collective still misses it. Cheap: at most one message every half second; a
    no-op outside a pool rank (torchrun mode has no controller to tell)."""
    global _last_beat
    if _HEARTBEAT is None:
        return
    now = time.monotonic()
    if now - _last_beat >= _HEARTBEAT_EVERY_S:
        _last_beat = now
        _HEARTBEAT()


def _set_current(context: RankContext | None, beat: Callable[[], None] | None = None) -> None:
    """Set (or clear) the running case's context and the function that sends its heartbeats."""
    global _CURRENT, _HEARTBEAT, _last_beat
    _CURRENT = context
    _HEARTBEAT = beat
    _last_beat = 0.0
