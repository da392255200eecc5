"""Turn what every rank did into one honest verdict and the text a person reads.

Why a pure module: the rules are the point of the harness, so they are plain functions over plain
records, tested without processes. The rules:

* any rank ``failed``, ``died``, ``timeout`` or ``stopped`` -> the test fails; the earliest such
  rank (by arrival at the controller) is named as the root cause, the others follow. A failure
  that only reports a lost or timed-out peer ("Connection closed by peer", a collective timeout)
  is a symptom, so it ranks after every other bad result. A failed rank is named by its
  exception's type and the first line of its message (its headline, made by the rank), as pytest's
  short summary names a failure: a traceback's last line is not that line when the message spans
  lines;
* every rank skipped -> skipped (xfailed likewise); some ranks skipped and others not -> failed,
  because an asymmetric skip means the ranks disagreed about what to test;
* otherwise passed, with each rank's return value.

A test therefore never passes while a rank failed.
"""

from __future__ import annotations

import dataclasses
import signal
from typing import Any

_BAD = ("failed", "died", "timeout", "stopped")
_LOG_TAIL_LINES = 40
_SYMPTOMS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Timed out waiting",
    "timed out",
    "Timeout",
)


class RankFailure(AssertionError):
    """Raised on the controller when the ranks did not all pass; the message names each bad rank."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RankResult:
    """One rank's part in one case, as the controller saw it."""

    rank: int
    status: str
    value: Any = None
    text: str = ""
    """The rank's own account: traceback (failed), reason (skipped/xfailed); empty otherwise. The
    root cause and symptom rules read only this, never the stacks or the output."""
    headline: str = ""
    """For ``failed``: ``Type: first line of the message`` of the rank's exception, made by the rank
    (``execute.headline``); ``""`` when the rank did not send one, and the last line of ``text``
    names the failure instead."""
    order: int = 0
    """Arrival order at the controller; the smallest bad one is the root cause."""
    exitcode: int | None = None
    log: str = ""
    """What the rank printed during the case: ``stdout`` then ``stderr``."""
    stacks: str = ""
    """Python stacks the controller asked for at the deadline, or ``faulthandler``'s dump when the
    rank crashed; ``[rank N]``-prefixed. Kept apart from ``text`` so a dump never reads as the
    rank's failure."""
    stdout: str = ""
    """What the rank wrote to stdout during the case."""
    stderr: str = ""
    """What the rank wrote to stderr during the case."""
    death: str = ""
    """For ``died``: what the controller found out about the death (``controller/memory.py``):
    whether the OOM killer did it, and the memory every rank held. A ``SIGKILL`` alone does not say
    whether the model did not fit or something else killed the rank."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    """The one outcome of a case."""

    outcome: str
    """``passed``, ``failed``, ``skipped`` or ``xfailed``."""
    summary: str
    """One line: what happened and, on failure, the root-cause rank."""
    message: str
    """The full text for the report (empty when passed)."""
    values: list[Any]


def describe_exit(exitcode: int | None) -> str:
    """``exit code 3`` / ``signal SIGSEGV (-11)`` / ``no exit code``, the way people say it."""
    if exitcode is None:
        return "no exit code (still running when stopped)"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"signal {name} ({exitcode})"
    return f"exit code {exitcode}"


def _last_line(result: RankResult) -> str:
    """The last line of the rank's text, without its ``[rank N]`` label."""
    last = result.text.rstrip().splitlines()[-1:] or [""]
    return last[0].split("] ", 1)[-1] if last[0].startswith("[rank ") else last[0]


def _headline(result: RankResult) -> str:
    if result.status == "failed":
        return f"rank {result.rank} failed: {result.headline or _last_line(result)}"
    if result.status == "died":
        why = f": {result.death}" if result.death else ""
        return f"rank {result.rank} died with {describe_exit(result.exitcode)}{why}"
    if result.status == "timeout":
        return f"rank {result.rank} did not finish before the deadline (no sign of progress within it)"
    if result.status in ("skipped", "xfailed"):
        return (
            f"rank {result.rank} {result.status} ({result.text!r}) while other ranks did not: "
            "an asymmetric skip (every rank must skip, or none)"
        )
    if result.status == "stopped":
        return f"rank {result.rank} was stopped (still running after another rank failed)"
    return f"rank {result.rank} {result.status}"


def _log_tail(result: RankResult) -> str:
    lines = result.log.rstrip().splitlines()
    if not lines:
        return ""
    shown = lines[-_LOG_TAIL_LINES:]
    head = f"[rank {result.rank}] -- output ({len(shown)} of {len(lines)} lines) --"
    return "\n".join([head, *(f"[rank {result.rank}] | {line}" for line in shown)])


def is_symptom(result: RankResult) -> bool:
    """A failure whose headline (or last line) only says a peer vanished or a collective timed out."""
    if result.status != "failed":
        return False
    return any(word in line for line in (result.headline, _last_line(result)) for word in _SYMPTOMS)


def judge(results: list[RankResult], *, world_size: int, include_output: bool = True) -> Verdict:
    """Apply the rules in the module docstring; ``results`` must hold one record per rank.

    ``include_output=False`` leaves the tail of what a died or stuck rank printed out of the
    message, for callers that show each rank's output elsewhere (the pytest plugin puts it in the
    test's captured output sections).
    """
    ranks = sorted(r.rank for r in results)
    assert ranks == list(range(world_size)), f"expected one result per rank, got ranks {ranks}"
    by_rank = sorted(results, key=lambda r: r.rank)
    statuses = {r.status for r in results}
    if statuses in ({"skipped"}, {"xfailed"}):
        (status,) = statuses
        reasons = sorted({r.text for r in results})
        reason = reasons[0] if len(reasons) == 1 else "; ".join(f"[rank {r.rank}] {r.text}" for r in by_rank)
        return Verdict(outcome=status, summary=reason, message=reason, values=[])
    # Mixed with anything else, a skip is an asymmetric skip: the ranks disagreed about what to test.
    bad = [r for r in results if r.status in _BAD or r.status in ("skipped", "xfailed")]
    if not bad:
        return Verdict(outcome="passed", summary="passed", message="", values=[r.value for r in by_rank])
    bad.sort(key=lambda r: (is_symptom(r), r.order, r.rank))
    root = bad[0]
    summary = f"{len(bad)} of {world_size} ranks did not pass; root cause: {_headline(root)}"
    blocks = [summary]
    for result in bad:
        label = "root cause" if result is root else "after the root cause"
        blocks.append(f"==== rank {result.rank} ({label}): {_headline(result)}")
        if result.text and result.status not in ("skipped", "xfailed"):
            blocks.append(result.text.rstrip())
        if result.stacks:
            blocks.append(result.stacks.rstrip())
        if include_output and result.status in ("died", "timeout", "stopped") and result.log:
            blocks.append(_log_tail(result))
    good = [r.rank for r in by_rank if r not in bad]
    if good:
        blocks.append(f"ranks that passed: {good}")
    return Verdict(outcome="failed", summary=summary, message="\n".join(blocks), values=[])
