"""Finding and killing the processes the rank pool started, by a tag in their environment.

Why a tag and not process-group ids: a pgid is a recycled pid, so a set of old rank pids names,
after pids wrap, process groups of strangers (another session's ranks, anything that called
``setsid``); and a descendant that calls ``setsid`` leaves its rank's group and is never found.
Instead, every process the pool starts carries ``SHARDSCALE_POOL_TAG=<tag>``, a value unique to
the controller process, in the environment it was exec'd with (``/proc/<pid>/environ``):

* the forkserver is exec'd with the tag (:func:`start_tagged_forkserver` puts it in
  ``os.environ`` just for that call), so every rank forked from it, and every process those fork
  (DataLoader workers), shows the forkserver's environment block;
* a rank's ``os.environ`` holds the tag, so everything a rank or its descendants exec inherits it,
  whatever its process group or session. Only a process exec'd with an explicit environment
  lacking the tag (``Popen(env={...})``) is not seen.

The controller's own ``os.environ`` does not keep the tag, so what a *test* starts from the
controller (an inner pytest session, a server) is not taken for the pool's. An inner session
started from a rank inherits the outer tag and appends its own (``outer:inner``) for its
forkserver: the inner controller finds its ranks' processes by its own tag alone, and the outer one
still finds everything its rank started, the inner session's ranks included.

Killing is race-free: a pid is opened as a pidfd *before* its tag is read, and the signal goes
through that pidfd, so a pid reused by a stranger in between is never signalled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import signal
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator

from harness.controller import allocator

TAG_VAR = "SHARDSCALE_POOL_TAG"

_tag: tuple[int, str] | None = None
_forkserver_lock = threading.Lock()
"""Pools started from two threads (``harness/parity/doors/lanes.py``) set the environment one at a time."""


def controller_tag() -> str:
    """This process's tag (a fresh one in a child forked from a controller)."""
    global _tag
    if _tag is None or _tag[0] != os.getpid():
        _tag = (os.getpid(), uuid.uuid4().hex)
    return _tag[1]


@contextlib.contextmanager
def _environ_with(name: str, value: str) -> Iterator[None]:
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


PRELOAD: list[str] = ["harness.rank.rank_main"]
"""What the forkserver imports once before it forks any rank (:func:`preload`)."""


def preload(*modules: str) -> None:
    """Have the forkserver import ``modules`` too (those the ranks' targets import: the parity
    engine's rank side, 1.6 s after torch), once, instead of each rank it forks. Effective before
    the forkserver starts; one that fails to import there is left to the ranks."""
    PRELOAD.extend(module for module in modules if module not in PRELOAD)


def start_tagged_forkserver(tag: str) -> None:
    """Make sure multiprocessing's forkserver (one per process, shared by every pool) runs, exec'd
    with ``tag`` appended to ``TAG_VAR`` and the ranks' allocator settings
    (``allocator.tunables``) if this call starts it, importing :data:`PRELOAD`. Cheap when it
    already runs. It returns once the server is spawned; the server imports meanwhile."""
    with _forkserver_lock:
        _start_tagged_forkserver(tag)


def _start_tagged_forkserver(tag: str) -> None:
    multiprocessing.forkserver.set_forkserver_preload(list(PRELOAD))
    multiprocessing.resource_tracker.ensure_running()  # not ours to report: start it untagged
    inherited = os.environ.get(TAG_VAR)
    with (
        _environ_with(TAG_VAR, f"{inherited}:{tag}" if inherited else tag),
        _environ_with(allocator.VARIABLE, allocator.tunables(os.environ.get(allocator.VARIABLE))),
    ):
        multiprocessing.forkserver.ensure_running()


@dataclasses.dataclass(frozen=True, slots=True)
class Proc:
    """A live process seen in ``/proc``."""

    pid: int
    ppid: int
    pgrp: int


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # gone, or not ours to read (another user's process)
        return b""


def _stat(pid: int) -> Proc | None:
    """``pid``'s parent and process group, or None when it is gone or a zombie."""
    raw = _read(f"/proc/{pid}/stat")
    if not raw:
        return None
    fields = raw.rsplit(b")", 1)[1].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return Proc(pid=pid, ppid=int(fields[1]), pgrp=int(fields[2]))


def carries_tag(pid: int, tag: str) -> bool:
    """Whether ``pid`` was exec'd (or forked from a process exec'd) with ``tag`` in ``TAG_VAR``."""
    prefix = f"{TAG_VAR}=".encode()
    for entry in _read(f"/proc/{pid}/environ").split(b"\0"):
        if entry.startswith(prefix):
            return tag.encode() in entry[len(prefix) :].split(b":")
    return False


def _is_helper(proc: Proc) -> bool:
    """The forkserver (or resource tracker) multiprocessing started for this process: it stays up
    until the interpreter exits, legitimately."""
    return proc.ppid == os.getpid() and b"from multiprocessing." in _read(f"/proc/{proc.pid}/cmdline")


def tagged_processes(tag: str) -> dict[int, Proc]:
    """Every live process carrying ``tag``, except this process and its multiprocessing helpers."""
    found = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        proc = _stat(int(entry))
        if proc is not None and carries_tag(proc.pid, tag) and not _is_helper(proc):
            found[proc.pid] = proc
    return found


def family(procs: dict[int, Proc], roots: Iterable[int]) -> set[int]:
    """The ``roots`` among ``procs``, the members of their process groups, and all their descendants."""
    members = {pid for pid in roots if pid in procs}
    members |= {p.pid for p in procs.values() if p.pgrp in members}
    grew = True
    while grew:
        more = {p.pid for p in procs.values() if p.ppid in members} - members
        members |= more
        grew = bool(more)
    return members


def _signal_if_tagged(pid: int, tag: str, send: Callable[[int], None]) -> bool:
    """Call ``send(pidfd)`` if ``pid`` is alive and carries ``tag``; return whether it was sent.

    The pidfd is opened before the tag is read, so it cannot refer to a process that took over the
    pid afterwards; a kernel without pidfds (or a pid already gone) means no signal at all.
    """
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if not carries_tag(pid, tag):
            return False
        send(fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def kill_if_tagged(pid: int, tag: str) -> bool:
    """SIGKILL ``pid`` if it carries ``tag``; return whether it was signalled."""
    return _signal_if_tagged(pid, tag, lambda fd: signal.pidfd_send_signal(fd, signal.SIGKILL))


def killpg_if_tagged(pgid: int, tag: str) -> bool:
    """SIGKILL process group ``pgid`` if its leader (pid ``pgid``) is alive and carries ``tag``.

    Once the leader is verified (and held by its pidfd), its group id stays reserved while the group
    has a member (Linux frees a pid only when no process uses it as pid, pgid or sid). The race left
    needs the whole group to exit and the pid to be handed out again, cycling through ``pid_max``
    pids, between the check and ``killpg``.
    """
    return _signal_if_tagged(pgid, tag, lambda _fd: os.killpg(pgid, signal.SIGKILL))


def kill_until_gone(find: Callable[[], list[int]], tag: str, *, timeout_s: float) -> list[int]:
    """SIGKILL what ``find()`` returns (if tagged) until it returns nothing or ``timeout_s`` passed
    (a process may fork while we kill, and a killed one takes a moment to become a zombie).
    Returns what ``find()`` still returns at the end."""
    until = time.monotonic() + timeout_s
    while (left := find()) and time.monotonic() < until:
        for pid in left:
            kill_if_tagged(pid, tag)
        time.sleep(0.02)
    return left


def warn_if_untagged(pid: int, tag: str, *, what: str) -> None:
    """Warn when a process forked from the forkserver lacks the tag: the forkserver was started (by
    someone else in this process) before the first pool, and cannot be restarted under it."""
    if not carries_tag(pid, tag):
        warnings.warn(
            f"{what} (pid {pid}) lacks {TAG_VAR}: the multiprocessing forkserver of this process was "
            "started before the first RankPool, so what the ranks leave running is neither found nor "
            "killed at the end of the session (start the pool before other forkserver users)",
            RuntimeWarning,
            stacklevel=3,
        )
