"""Helpers the parity suites share (the fixtures are in ``conftest.py``); the executor, the failure
message and the JUnit properties are the pytest front door's (``harness.parity.doors.testing``), so the
suites and a user's ``parity_test`` report alike."""

from __future__ import annotations

import dataclasses

from harness.parity.doors.runner import describe
from harness.parity.doors.testing import junit_properties, ranks_executor

__all__ = ["describe", "junit_properties", "ranks_executor", "unaffected_by_expected_failures"]


def unaffected_by_expected_failures(func):
    """Mark a test whose assertion holds even where torch's scaler is expected to fail."""
    func.unaffected_by_expected_failures = True
    return func


@dataclasses.dataclass(frozen=True)
class CliRun:
    """What ``python -m harness.parity ARGS`` printed and returned."""

    returncode: int
    stdout: str
    stderr: str


def cli_in_process(*args: str) -> CliRun:
    """``python -m harness.parity ARGS`` run in this process: for ``--list`` and argument errors,
    which start no rank, a new interpreter importing torch costs seconds a test and shows nothing
    more (the e2e tier runs the real command)."""
    import contextlib
    import io

    from harness.parity.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as stop:  # argparse's errors exit 2
            code = stop.code if isinstance(stop.code, int) else 1
    return CliRun(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())
