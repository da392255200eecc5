"""The pytest side of the gate: the command that runs a tier, and what its JUnit XML says.

The CPU tier is what ``make test`` runs (``pytest suites -m "not e2e and not world_sizes and not two_d and not pipeline and not property and not compile"``),
without the tests marked ``gpu`` (the end-to-end tests, ``make e2e``, the world-size-8 tests, ``make
world-sizes``, and the judge's property on its drawn sample, ``make property``, are CI jobs of their
own, so nothing runs twice);
the GPU tier is what ``make test-gpu`` runs in strict mode (``-m gpu --require-gpus N``: a GPU
test skipped for lack of GPUs fails). Either session also writes the JUnit XML (each parity test
with its configuration's metrics as properties, recorded by the parity suites) and, through
:mod:`ci.gate.pytest_plugin`, the parity reports.
"""

from __future__ import annotations

import dataclasses
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

DEFAULT_TESTS = ("suites",)

# pytest's exit statuses (pytest.ExitCode), spelled out so this module does not import pytest.
PYTEST_OK, PYTEST_FAILED, PYTEST_INTERRUPTED, PYTEST_INTERNAL, PYTEST_USAGE, PYTEST_NO_TESTS = range(6)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Tier:
    """A tier of the gate."""

    name: str
    backend: str
    """The parity backend its configurations use, which names its baselines."""
    marker: str
    """The ``-m`` expression that selects it."""


CPU = Tier(
    name="cpu",
    backend="gloo",
    marker="not gpu and not e2e and not world_sizes and not two_d and not pipeline and not property and not compile",
)
GPU = Tier(name="gpu", backend="nccl", marker="gpu")


def pytest_command(
    tier: Tier,
    *,
    tests: Sequence[str],
    keyword: str,
    out: Path,
    plot: bool,
    require_gpus: int = 0,
) -> list[str]:
    """The pytest command line of one gate run."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        *tests,
        "-q",
        "-m",
        tier.marker,
        "-p",
        "ci.gate.pytest_plugin",
        f"--parity-reports={out}",
        f"--junitxml={out / 'junit.xml'}",
        "-o",
        "junit_suite_name=shardscale",
        "-o",
        "junit_family=xunit1",  # testcase properties (each parity configuration's metrics) are xunit1
        "-o",
        "junit_logging=no",
    ]
    if not plot:
        command.append("--parity-reports-no-plot")
    if keyword:
        command += ["-k", keyword]
    if require_gpus:
        command.append(f"--require-gpus={require_gpus}")
    return command


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Failure:
    """A test that failed or errored, and the first line of why."""

    test: str
    """``path/to/test_file.py::test_name[id]``."""
    message: str
    collection: bool = False
    """It failed to be collected (an import error, a syntax error)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Tally:
    """What the JUnit XML of one session holds."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    xfailed: int = 0
    failures: tuple[Failure, ...] = ()

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped + self.xfailed

    def describe(self) -> str:
        parts = [f"{self.passed} passed", f"{self.failed} failed", f"{self.skipped} skipped"]
        if self.xfailed:
            parts.append(f"{self.xfailed} xfailed")
        return ", ".join(parts)


def _test_id(case: ET.Element) -> str:
    """``suites/parity/test_x.py::test_name[id]``: pytest's ``file`` (xunit1 writes it), else the path
    guessed from ``classname`` (``suites.parity.test_x``), then the class for a method and ``name``."""
    parts = case.get("classname", "").split(".")
    cut = next((i for i, part in enumerate(parts) if part[:1].isupper()), len(parts))
    path = case.get("file") or "/".join(parts[:cut]) + ".py"
    return "::".join([path, *parts[cut:], case.get("name", "")])


def _first_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[0] if lines else ""


def read_junit(path: Path) -> Tally:
    """Count the outcomes in pytest's JUnit XML at ``path`` and keep every failure's first line."""
    root = ET.parse(path).getroot()
    passed = failed = skipped = xfailed = 0
    failures = []
    for case in root.iter("testcase"):
        problem = next((child for child in case if child.tag in ("failure", "error")), None)
        skip = case.find("skipped")
        if problem is not None:
            failed += 1
            message = _first_line(problem.get("message")) or _first_line(problem.text)
            failures.append(
                Failure(
                    test=_test_id(case),
                    message=message,
                    collection=problem.tag == "error" and "collect" in (problem.get("message") or ""),
                )
            )
        elif skip is not None:
            if skip.get("type") == "pytest.xfail":
                xfailed += 1
            else:
                skipped += 1
        else:
            passed += 1
    return Tally(passed=passed, failed=failed, skipped=skipped, xfailed=xfailed, failures=tuple(failures))
