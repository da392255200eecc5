"""Run the gate against each plant, each in its own copy of the project, a few at a time.

Why copies: the working tree is never modified (an interrupted run leaves no planted bug behind),
and mutants can run side by side. A copy holds the project's files as git lists them (tracked and
untracked, not ignored: no ``.venv``, no reports); the tests run with the same interpreter, from
the copy's root, where ``import scaler`` finds the copy's ``scaler/`` before the editable install's
(which points at the working tree): :func:`check_imports_from_copy` makes sure of that before
anything is trusted.

First a *control* run: the gate on an unplanted copy with every plant's tests must pass, or a
"kill" would prove nothing. Then each plant: exit 1 of the gate is a kill (its ``gate.json`` says
by which tests and curves), 0 a survivor, anything else an error.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ci.gate import process
from ci.mutation.plants import Plant, apply

ROOT = Path(__file__).resolve().parents[2]
GATE_TIMEOUT_S = 600


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """What the gate did with one mutant (or the control)."""

    name: str
    verdict: str
    """``killed``, ``survived`` or ``error``."""
    killed_by: tuple[str, ...] = ()
    """Failed tests and curve findings, as the gate named them."""
    seconds: float = 0.0
    detail: str = ""
    """Why it is an error; the log's path."""


def project_files(root: Path) -> list[str]:
    """The files of the project as git sees them (tracked, and untracked but not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [name for name in listed.split("\0") if name and (root / name).is_file()]


def copy_project(root: Path, destination: Path) -> None:
    for name in project_files(root):
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target)


def check_imports_from_copy(copy: Path) -> None:
    """Fail unless the interpreter, run from ``copy``, imports scaler, harness and ci from it."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import ci, harness, scaler; print(scaler.__file__, harness.__file__, ci.__file__)",
        ],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=120,
    )
    files = done.stdout.split()
    if (
        done.returncode != 0
        or len(files) != 3
        or not all(Path(f).resolve().is_relative_to(copy) for f in files)
    ):
        raise RuntimeError(
            f"from {copy} the interpreter imports {files or done.stderr.strip()}: a mutant would not be tested"
        )


def gate_command(tests: Sequence[str], out: Path) -> list[str]:
    return [sys.executable, "-m", "ci.gate", *tests, "--out", str(out), "--no-plot"]


def run_gate(name: str, copy: Path, tests: Sequence[str]) -> Outcome:
    """The gate on ``copy`` with ``tests``; its log is ``copy/gate.log``."""
    out = copy / "gate-out"
    log = copy / "gate.log"
    started = time.monotonic()
    with log.open("w") as stream:
        try:
            code = process.call(gate_command(tests, out), cwd=copy, stdout=stream, timeout=GATE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return Outcome(
                name=name, verdict="error", seconds=time.monotonic() - started, detail=f"timed out; log {log}"
            )
    seconds = time.monotonic() - started
    if code == 0:
        return Outcome(name=name, verdict="survived", seconds=seconds, detail=f"log {log}")
    if code != 1:
        return Outcome(name=name, verdict="error", seconds=seconds, detail=f"gate exit {code}; log {log}")
    verdict = json.loads((out / "gate.json").read_text())
    killed_by = [failure["test"] for failure in (verdict["tests"] or {}).get("failures", [])]
    killed_by += [
        f"curve {f['configuration']} {f['metric']}".rstrip()
        for f in (verdict["curves"] or {}).get("findings", [])
        if f["kind"] in ("regression", "missing", "not_run")
    ]
    return Outcome(name=name, verdict="killed", killed_by=tuple(killed_by), seconds=seconds)


def run_all(
    plants: Sequence[Plant],
    *,
    jobs: int,
    workdir: Path,
    control: bool = True,
    on_outcome: Callable[[Outcome], None] | None = None,
) -> tuple[Outcome | None, list[Outcome]]:
    """The control (unless ``control`` is False) and one outcome per plant, in ``plants`` order."""
    base = workdir / "base"
    copy_project(ROOT, base)
    check_imports_from_copy(base)
    for plant in plants:  # every plant must still apply before anything runs
        trial = workdir / "trial"
        for package in {edit.package for edit in plant.edits}:
            shutil.copytree(base / package, trial / package)
        apply(plant, trial)
        shutil.rmtree(trial)
    control_outcome = None
    if control:
        tests = list(dict.fromkeys(test for plant in plants for test in plant.tests))
        control_outcome = run_gate("control", base, tests)
        if on_outcome is not None:
            on_outcome(control_outcome)
        if control_outcome.verdict != "survived":
            return control_outcome, []

    def one(plant: Plant) -> Outcome:
        copy = workdir / plant.name
        shutil.copytree(base, copy, ignore=shutil.ignore_patterns("gate-out", "gate.log", ".pytest_cache"))
        apply(plant, copy)
        outcome = run_gate(plant.name, copy, plant.tests)
        if on_outcome is not None:
            on_outcome(outcome)
        return outcome

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs)
    try:
        outcomes = list(pool.map(one, plants))
    except BaseException:  # Ctrl-C, SIGTERM: start no other mutant, stop the running ones' gates
        pool.shutdown(wait=False, cancel_futures=True)
        process.stop_all()
        raise
    pool.shutdown()
    return control_outcome, outcomes


def temporary_workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="shardscale-mutation-"))
