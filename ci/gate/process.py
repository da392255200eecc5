"""Child processes that end with their parent: the gate's pytest session, the benchmarks, and the
mutation check's gate runs.

Why: CI cancels a job with SIGTERM to the job's main process; ``subprocess.call`` would leave its
child (a pytest session with warm ranks) running on the runner. :func:`terminate_on_sigterm` turns
SIGTERM into ``SystemExit`` in the main thread, and :func:`call` stops its child on any exception
that interrupts the wait (that one, Ctrl-C, a timeout) before passing it on.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

_live: set[subprocess.Popen[bytes]] = set()
_lock = threading.Lock()


def terminate_on_sigterm() -> None:
    """Make SIGTERM raise ``SystemExit(143)`` in the main thread (so ``finally`` blocks run)."""

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def call(
    command: Sequence[str],
    *,
    cwd: Path,
    stdout: IO[str] | None = None,
    timeout: float | None = None,
    grace_s: float = 10.0,
    env: Mapping[str, str] | None = None,
) -> int:
    """Run ``command`` and return its exit status; if the wait is interrupted (or times out: then
    ``subprocess.TimeoutExpired`` is raised), the child gets SIGTERM, then SIGKILL after ``grace_s``.
    ``env`` replaces the child's environment (default: this process's)."""
    child = subprocess.Popen(
        list(command),
        cwd=cwd,
        stdout=stdout,
        stderr=subprocess.STDOUT if stdout else None,
        env=None if env is None else dict(env),
    )
    try:
        return child.wait(timeout=timeout)
    except BaseException:
        child.terminate()
        try:
            child.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        raise
