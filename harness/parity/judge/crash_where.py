"""Where each rank was when a batch failed, read from the harness's report (controller side, pure).

Why: when a rank dies (a C++ abort, a segfault, the OOM killer) the report holds every rank's
Python stack, dozens of lines each, and the question a user has is one line: what was each rank
doing, and did the ranks run different collectives (a desync)? This module turns the stacks into
``rank 1 in harness/parity/ranks/sides/full/gather.py full_tensors -> all_gather_into_tensor``, and, when the
ranks stopped in different places, into ``the ranks ran different collectives: rank 0 in ...,
rank 1 in ...``. It reads text only, so it works on any report the pool, the pytest front door or
torchrun produced.
"""

from __future__ import annotations

import re

_SECTION = re.compile(r"^==== rank (\d+)")
_THREAD = re.compile(r"^\[rank (\d+)\] (?:Current thread|Thread) 0x[0-9a-f]+")
_FRAME = re.compile(r'^\[rank (\d+)\]\s+File "([^"]+)", line \d+ in (\S+)')
_LIBRARY = ("site-packages", "/lib/python", "<frozen", "<string>")
_HARNESS_ENTRY = ("call_case", "_on_run_case", "serve", "rank_entry", "_rank_entry")
_AGREEMENTS = ("agree", "all_ranks")
"""The harness's own agreements through the store: a rank waiting there waits for its peers as
in a collective."""


def _frames_by_rank(report: str) -> dict[int, list[tuple[str, str]]]:
    """Each rank's busiest thread (the one with the most frames, the case's), most recent first."""
    threads: dict[int, list[list[tuple[str, str]]]] = {}
    for line in report.splitlines():
        if match := _THREAD.match(line):
            threads.setdefault(int(match.group(1)), []).append([])
        elif (match := _FRAME.match(line)) and threads.get(int(match.group(1))):
            threads[int(match.group(1))][-1].append((match.group(2), match.group(3)))
    return {rank: max(stacks, key=len) for rank, stacks in threads.items() if any(stacks)}


def _short(path: str) -> str:
    """``harness/parity/ranks/sides/full/gather.py`` for the project's files, the file name for anyone else's."""
    for package in ("harness/", "scaler/", "fixtures/", "suites/"):
        index = path.rfind("/" + package)
        if index >= 0:
            return path[index + 1 :]
    return path.rsplit("/", 1)[-1]


def place(frames: list[tuple[str, str]]) -> tuple[str, bool] | None:
    """``(file function -> library call, whether that is a collective)`` for the innermost frame
    outside the libraries (and the library function it called, wrappers skipped); None for a rank
    idle between cases."""
    for index, (path, function) in enumerate(frames):
        if any(marker in path for marker in _LIBRARY):
            continue
        if function in _HARNESS_ENTRY:
            return None
        inner = [(p, name) for p, name in reversed(frames[:index]) if name not in ("wrapper", "inner")]
        called = inner[0][1] if inner else None
        collective = function in _AGREEMENTS or any("torch/distributed" in p for p, _ in inner)
        return f"{_short(path)} {function}" + (f" -> {called}" if called else ""), collective
    return None


def places(report: str) -> dict[int, tuple[str, bool]]:
    """``{rank: (where it was, whether in a collective)}`` for every rank whose stack the report
    holds."""
    found = {rank: place(frames) for rank, frames in _frames_by_rank(report).items()}
    return {rank: where for rank, where in sorted(found.items()) if where is not None}


def summary(report: str) -> str:
    """One line: where each rank was, said as a desync when two or more ranks waited in
    collectives that differ ("" when the report holds no stack)."""
    where = places(report)
    if not where:
        return ""
    listed = ", ".join(f"rank {rank} in {text}" for rank, (text, _) in where.items())
    collectives = {text for text, collective in where.values() if collective}
    if len(collectives) > 1:
        return f"the ranks ran different collectives: {listed}"
    return listed
