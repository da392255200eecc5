"""``python -m ci.mutation`` (``make mutation``): how strong is the gate? Plant each known bug class
into a copy of ``scaler/``, run the gate against it, report killed/total with the survivors named.

Exit status: 0 every plant was killed; 1 a plant survived (the suites have a hole: write the test
that kills it); 2 bad arguments, a plant that no longer applies to ``scaler/``, a control run that
fails without any plant, or a mutant run that could not finish. Writes ``mutation.md`` and
``mutation.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from ci.gate import process
from ci.mutation.plants import PLANTS, PlantError
from ci.mutation.run import Outcome, run_all, temporary_workdir


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ci.mutation", description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="mutants run side by side (default 2)")
    parser.add_argument(
        "--only", action="append", default=None, metavar="PLANT", help="run only this plant (repeatable)"
    )
    parser.add_argument(
        "--list", action="store_true", help="print the plants and the tests each runs, and exit"
    )
    parser.add_argument("--no-control", action="store_true", help="skip the control run on an unplanted copy")
    parser.add_argument(
        "--keep", action="store_true", help="keep the copies and their logs (printed at the end)"
    )
    parser.add_argument("--out", type=Path, default=Path("reports"), help="folder for mutation.md/.json")
    options = parser.parse_args(argv)
    if options.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {options.jobs}")
    names = [plant.name for plant in PLANTS]
    unknown = [name for name in options.only or () if name not in names]
    if unknown:
        parser.error(f"--only {', '.join(unknown)}: no such plant; the plants are {', '.join(names)}")
    options.plants = [plant for plant in PLANTS if not options.only or plant.name in options.only]
    return options


def render_table(outcomes: list[Outcome], bugs: dict[str, str]) -> str:
    """The Markdown table: plant, bug, verdict, killed by, seconds."""
    lines = ["| plant | bug class | verdict | killed by | time |", "|---|---|---|---|---|"]
    for outcome in outcomes:
        by = "<br>".join(f"`{name}`" for name in outcome.killed_by) or outcome.detail or "-"
        lines.append(
            f"| `{outcome.name}` | {bugs.get(outcome.name, '')} | {outcome.verdict} | {by} | {outcome.seconds:.0f}s |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    if options.list:
        for plant in options.plants:
            print(f"{plant.name}: {plant.bug}")
            for test in plant.tests:
                print(f"    {test}")
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    workdir = temporary_workdir()
    started = time.monotonic()
    print(
        f"mutation: {len(options.plants)} plants, {options.jobs} at a time, copies under {workdir}",
        flush=True,
    )

    def progress(outcome: Outcome) -> None:
        by = ", ".join(outcome.killed_by[:3]) + (" ..." if len(outcome.killed_by) > 3 else "")
        print(
            f"  {outcome.verdict:<8} {outcome.name:<32} {outcome.seconds:5.0f}s  {by or outcome.detail}",
            flush=True,
        )

    try:
        control, outcomes = run_all(
            options.plants,
            jobs=options.jobs,
            workdir=workdir,
            control=not options.no_control,
            on_outcome=progress,
        )
    except PlantError as error:
        print(f"mutation: ERROR (exit 2): {error}", file=sys.stderr)
        return 2
    finally:
        if not options.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    wall = time.monotonic() - started
    if control is not None and control.verdict != "survived":
        print(
            f"mutation: ERROR (exit 2): the gate does not pass on an unplanted copy ({control.verdict}, "
            f"{', '.join(control.killed_by) or control.detail}); fix the suites first",
            file=sys.stderr,
        )
        return 2
    bugs = {plant.name: plant.bug for plant in options.plants}
    killed = [o for o in outcomes if o.verdict == "killed"]
    survived = [o.name for o in outcomes if o.verdict == "survived"]
    errors = [o.name for o in outcomes if o.verdict == "error"]
    table = render_table(outcomes, bugs)
    summary = f"killed {len(killed)}/{len(outcomes)} plants in {wall:.0f}s ({options.jobs} at a time)"
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "mutation.md").write_text(f"# Mutation check\n\n{summary}\n\n{table}\n")
    (options.out / "mutation.json").write_text(
        json.dumps(
            {
                "schema": "shardscale.mutation",
                "version": 1,
                "wall_s": round(wall, 1),
                "control_s": None if control is None else round(control.seconds, 1),
                "plants": [
                    {
                        "name": o.name,
                        "bug": bugs[o.name],
                        "verdict": o.verdict,
                        "killed_by": list(o.killed_by),
                        "seconds": round(o.seconds, 1),
                        "detail": o.detail,
                    }
                    for o in outcomes
                ],
            },
            indent=1,
        )
        + "\n"
    )
    print(f"\n{table}\n\nmutation: {summary}; wrote {options.out / 'mutation.md'}")
    if options.keep:
        print(f"mutation: copies and logs kept under {workdir}")
    if errors:
        print(
            f"mutation: ERROR (exit 2): {', '.join(errors)} could not be judged (see their logs with --keep)"
        )
        return 2
    if survived:
        print(f"mutation: FAIL (exit 1): survivors: {', '.join(survived)}; write the tests that kill them")
        return 1
    return 0


if __name__ == "__main__":
    process.terminate_on_sigterm()
    sys.exit(main())
