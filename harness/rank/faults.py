"""Faults to inject on one chosen rank (rank side), for the harness's own self-tests and yours.

Why helpers: a self-test must fail in exactly one known way on exactly one rank; writing the
``if rank == 1: os._exit(3)`` by hand in every test hides which fault is meant. Every helper is a
no-op on the other ranks, and takes the rank first, keyword-only arguments after.
"""

from __future__ import annotations

import ctypes
import os
import signal as _signal
import sys
import time
from typing import Any

from harness.rank import context


def _here(rank: int) -> bool:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be an int >= 0, got {rank!r}")
    return context.current().rank == rank


def raise_on(rank: int, exc: BaseException | None = None) -> None:
    """Raise ``exc`` (default ``RuntimeError("injected fault on rank N")``) on ``rank``."""
    if _here(rank):
        raise exc if exc is not None else RuntimeError(f"injected fault on rank {rank}")


def exit_on(rank: int, code: int = 1, *, hard: bool = False) -> None:
    """``sys.exit(code)`` on ``rank``; with ``hard=True`` ``os._exit(code)`` (no cleanup at all)."""
    if _here(rank):
        if hard:
            sys.stdout.flush()
            os._exit(code)
        sys.exit(code)


def signal_on(rank: int, sig: int = _signal.SIGSEGV) -> None:
    """Send ``sig`` to the rank's own process (``SIGSEGV``, ``SIGKILL``, ...)."""
    if _here(rank):
        sys.stdout.flush()
        if sig == _signal.SIGSEGV:
            import faulthandler

            faulthandler._sigsegv()  # a real segmentation fault, dumped by faulthandler
        os.kill(os.getpid(), sig)
        time.sleep(5)  # the signal is delivered before this returns


def hang_on(rank: int, *, hold_gil: bool = False, seconds: float = 3600.0) -> None:
    """Block ``rank`` for ``seconds``; with ``hold_gil=True`` inside a C call that keeps the GIL."""
    if not _here(rank):
        return
    until = time.monotonic() + seconds
    if hold_gil:
        libc = ctypes.PyDLL(None)  # PyDLL: the GIL stays held during the call
        while time.monotonic() < until:
            libc.sleep(1)
    else:
        while time.monotonic() < until:
            time.sleep(0.1)


def delay_on(rank: int, seconds: float) -> None:
    """Sleep ``seconds`` on ``rank`` (peers then wait in their next collective)."""
    if seconds < 0:
        raise ValueError(f"seconds must be >= 0, got {seconds}")
    if _here(rank):
        time.sleep(seconds)


def corrupt_grad(rank: int, parameters: Any, *, value: float = float("inf"), index: int = 0) -> None:
    """Write ``value`` (inf by default, or nan) into element 0 of the ``index``-th grad on ``rank``.

    ``parameters`` is a module or an iterable of parameters; call after ``backward()``.
    """
    if not _here(rank):
        return
    params = list(parameters.parameters() if hasattr(parameters, "parameters") else parameters)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        raise ValueError("corrupt_grad needs at least one parameter with a .grad; call it after backward()")
    if not 0 <= index < len(grads):
        raise ValueError(f"index must be in [0, {len(grads)}), got {index}")
    grad = grads[index]
    local = grad.to_local() if hasattr(grad, "to_local") else grad
    local.view(-1)[0] = value
