"""The controller's proxy of one rank process: its command pipe, its process and its files.

Why the files are apart: a rank writes what the test prints (fd 1 and fd 2) to one file each, and
``faulthandler`` writes Python stacks (on ``SIGUSR1``, or when the rank crashes) to a third. The
controller then reports a rank's output, its failure and its stacks each once, and a stack dump
can never be taken for the end of a rank's traceback or appear inside its output.

Files, never pipes: a rank writing into a pipe nobody reads (between cases, or while the
controller is busy) would block, and ``faulthandler`` with it. A file never blocks; the controller
reads what was appended since a given offset (:class:`Tail`).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from harness.outcome import RankResult
from harness.protocol import Message, RankFiles

STACK_SIGNAL = signal.SIGUSR1  # must match rank_main.STACK_SIGNAL (rank_main imports torch)
_STACK_DUMP_WAIT_S = 3.0


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read(path: str, start: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read()
    except OSError:
        return b""


class Tail:
    """What was appended to a file since this object was made, handed out in whole lines."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = _size(path)
        self._partial = b""

    def lines(self) -> str:
        """The complete lines appended since the last call (a partial last line waits)."""
        data = self._partial + self._advance()
        complete, newline, self._partial = data.rpartition(b"\n")
        return (complete + newline).decode("utf-8", "replace")

    def rest(self) -> str:
        """Everything appended since the last call, a partial last line included (ended with a newline)."""
        data = self._partial + self._advance()
        self._partial = b""
        if data and not data.endswith(b"\n"):
            data += b"\n"
        return data.decode("utf-8", "replace")

    @staticmethod
    def whole(path: str) -> str:
        """The whole file as text (empty when it does not exist)."""
        return _read(path, 0).decode("utf-8", "replace")

    def _advance(self) -> bytes:
        data = _read(self.path, self.offset)
        self.offset += len(data)
        return data


class RankHandle:
    """The controller's proxy of one rank process."""

    def __init__(self, rank: int, process: Any, conn: Any, files: RankFiles) -> None:
        self.rank = rank
        self.process = process
        self.conn = conn
        self.files = files
        self.pid: int | None = None
        self.gone = False

    def send(self, command: Message) -> None:
        self.conn.send(command.to_wire())


OutputCallback = Callable[[int, str, str], None]
"""``on_output(rank, stream, text)``: ``stream`` is ``"stdout"`` or ``"stderr"``, ``text`` whole lines."""


class CaseOutput:
    """What the ranks of one case write: stdout and stderr as the test printed them (handed to
    ``on_output`` as whole lines while the case runs), and what ``faulthandler`` wrote when a rank
    crashed. Made before the case is sent, so nothing printed earlier (between cases, while joining
    a group) is taken for the case's."""

    def __init__(self, handles: list[RankHandle], on_output: OutputCallback | None = None) -> None:
        self._tails = {
            h.rank: {name: Tail(getattr(h.files, name)) for name in ("stdout", "stderr", "stacks")}
            for h in handles
        }
        self._on_output = on_output
        self._text: dict[tuple[int, str], list[str]] = {}

    def pump(self) -> None:
        """Take the whole lines the ranks wrote since the last call."""
        self._take(Tail.lines)

    def finish(self) -> None:
        """Take everything the ranks wrote so far, partial last lines included."""
        self._take(Tail.rest)

    def _take(self, read: Callable[[Tail], str]) -> None:
        for rank, tails in self._tails.items():
            for stream in ("stdout", "stderr"):
                text = read(tails[stream])
                if text:
                    self._text.setdefault((rank, stream), []).append(text)
                    if self._on_output is not None:
                        self._on_output(rank, stream, text)

    def crash_dump(self, rank: int) -> str:
        """What ``faulthandler`` wrote when ``rank`` crashed (``[rank N]``-prefixed; empty if nothing)."""
        return prefix(self._tails[rank]["stacks"].rest(), rank)

    def attach(self, result: RankResult) -> RankResult:
        """``result`` with the rank's output of this case (taken so far) filled in."""
        stdout = "".join(self._text.get((result.rank, "stdout"), []))
        stderr = "".join(self._text.get((result.rank, "stderr"), []))
        return dataclasses.replace(result, stdout=stdout, stderr=stderr, log=stdout + stderr)


def prefix(text: str, rank: int) -> str:
    """Every line of ``text`` starting with ``[rank N]`` (empty stays empty)."""
    return "\n".join(f"[rank {rank}] {line}" for line in text.rstrip().splitlines())


def dump_stacks(handles: list[RankHandle], *, title: str) -> dict[int, str]:
    """Every live rank's Python stacks (``faulthandler`` on ``SIGUSR1``, works with the GIL held),
    each headed ``[rank N] {title}:``; waits at most a few seconds for the dumps to be written."""
    live = [h for h in handles if not h.gone and h.pid is not None]
    tails = {h.rank: Tail(h.files.stacks) for h in live}
    for handle in live:
        try:
            os.kill(handle.pid, STACK_SIGNAL)  # type: ignore[arg-type]
        except ProcessLookupError:
            pass
    until = time.monotonic() + _STACK_DUMP_WAIT_S
    sizes = {h.rank: -1 for h in live}
    while time.monotonic() < until:  # until every dump is written and has stopped growing
        time.sleep(0.05)
        now = {h.rank: _size(h.files.stacks) for h in live}
        if all(now[r] > tails[r].offset and now[r] == sizes[r] for r in now):
            break
        sizes = now
    return {
        h.rank: f"[rank {h.rank}] {title}:\n{prefix(tails[h.rank].rest(), h.rank)}".rstrip() for h in live
    }
