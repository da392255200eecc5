"""Messages between the controller (``pool.py``) and a rank (``rank_main.py``).

Why a module of its own: the two process sides share nothing else, so this file is the whole
contract. Every message is a frozen dataclass tagged with a ``kind``; ``to_wire()`` turns it into a
plain dict that ``multiprocessing`` pickles, and ``from_wire()`` turns it back, refusing kinds it
does not know. The controller sends *commands* (``InitGroup``, ``LeaveGroup``, ``RunCase``,
``Shutdown``); a rank sends *events* (``RankStarted``, ``Ack``, ``Heartbeat``, ``CaseFinished``). ``RankCrashed``
is made by the controller itself when a rank process dies, so that the one loop that owns the
pool's state sees deaths and answers through the same dispatch. ``RankFiles`` names the files a
rank writes and the controller reads (output and stacks never travel through the pipe).
"""

from __future__ import annotations

import dataclasses
import enum
import os
from typing import Any, ClassVar

#: Statuses a rank (or the controller, for ``died``/``timeout``/``stopped``) gives one case.
STATUSES = ("passed", "failed", "skipped", "xfailed", "died", "timeout", "stopped")


class Placeholder(enum.Enum):
    """An argument the rank fills in itself (the ``rank`` and ``world_size`` fixtures)."""

    RANK = "rank"
    WORLD_SIZE = "world_size"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Message:
    """Base of every message; subclasses set ``kind``."""

    kind: ClassVar[str] = ""

    def to_wire(self) -> dict[str, Any]:
        """A plain dict (shallow: argument values are left as they are, pickle carries them)."""
        wire = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        wire["kind"] = self.kind
        return wire


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class InitGroup(Message):
    """Join a fresh default process group (leaving any previous one first)."""

    kind: ClassVar[str] = "init_group"
    backend: str
    world_size: int
    prefix: str
    """Store key prefix of this group; fresh for every (re-)initialisation."""
    collective_timeout_s: float


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LeaveGroup(Message):
    """Destroy the process group, if any, and stay idle (the rank is outside the new world)."""

    kind: ClassVar[str] = "leave_group"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RunCase(Message):
    """Import ``target`` (``module:qualname``) and call it with ``args``/``kwargs``."""

    kind: ClassVar[str] = "run_case"
    case_id: int
    target: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    sys_path: tuple[str, ...] = ()
    """The controller's ``sys.path``; entries the rank lacks are added so test modules import."""
    prefix: str = ""
    """Store key prefix of this case (``harness.current().store``)."""
    collective_timeout_s: float = 30.0


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Shutdown(Message):
    """Leave the group and exit with code 0."""

    kind: ClassVar[str] = "shutdown"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RankStarted(Message):
    """First event of a rank: it is detached, guarded against orphaning and ready for commands."""

    kind: ClassVar[str] = "rank_started"
    rank: int
    pid: int


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Ack(Message):
    """Answer to ``InitGroup``/``LeaveGroup``; ``error`` is a traceback when it did not work."""

    kind: ClassVar[str] = "ack"
    rank: int
    command: str
    error: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CaseFinished(Message):
    """One rank's outcome of one case."""

    kind: ClassVar[str] = "case_finished"
    case_id: int
    rank: int
    status: str
    value: bytes | None = None
    """The function's return value, pickled by the rank with the standard pickler, when
    ``status == "passed"`` (so tensors travel by value, not as shared-memory descriptors)."""
    text: str = ""
    """Traceback for ``failed``, reason for ``skipped``/``xfailed``."""
    headline: str = ""
    """For ``failed``: ``Type: first line of the message`` of the exception (``execute.headline``)."""
    duration_s: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Heartbeat(Message):
    """A case's sign of progress (``harness.rank.context.heartbeat``): each one restarts the case's
    deadline for this rank, so the deadline guards against hangs, not against slow, large work."""

    kind: ClassVar[str] = "heartbeat"
    case_id: int
    rank: int


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RankCrashed(Message):
    """A rank process ended without being asked to (made by the controller)."""

    kind: ClassVar[str] = "rank_crashed"
    rank: int
    exitcode: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class RankFiles:
    """The three files one rank process writes: what the test prints to fd 1 and fd 2, and the
    Python stacks ``faulthandler`` dumps (on the stack signal, or when the rank crashes). Given to
    the rank when it starts; the controller reads them."""

    stdout: str
    stderr: str
    stacks: str

    @classmethod
    def in_dir(cls, log_dir: str, rank: int, serial: int) -> RankFiles:
        base = os.path.join(log_dir, f"rank{rank}-{serial}")
        return cls(stdout=f"{base}.out", stderr=f"{base}.err", stacks=f"{base}.stacks")


MESSAGE_TYPES: tuple[type[Message], ...] = (
    InitGroup,
    LeaveGroup,
    RunCase,
    Shutdown,
    RankStarted,
    Ack,
    CaseFinished,
    Heartbeat,
    RankCrashed,
)
_BY_KIND = {cls.kind: cls for cls in MESSAGE_TYPES}


def from_wire(wire: dict[str, Any]) -> Message:
    """Rebuild the message ``to_wire()`` produced; unknown kinds raise ``ValueError``."""
    data = dict(wire)
    kind = data.pop("kind", None)
    cls = _BY_KIND.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown message kind {kind!r}; known kinds: {sorted(_BY_KIND)}")
    return cls(**data)
