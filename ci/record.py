"""The behaviour record: the configurations of the matrices users run, and every row's verdict, kept
so that a reshaping of the engine shows that it changed nothing.

Why: a refactor of the configuration, the rank side or the judge can change an id (a ``-k`` filter
or a CI baseline stops matching), a reference shared between rows, or a verdict, without any one
test noticing. ``ci/baselines/record/NAME.tsv`` holds, per matrix, every configuration in order
with its status, what a pass measured (``bitwise``, ``staged``, ...), its profile and the known
causes named. ``suites/ci/test_record.py`` checks the ids in ``make test`` (cheap: no rank runs)
and the verdicts in the tier that runs each matrix (``world_sizes``, ``two_d``, ``reshard``).

Write a record (after a change that is meant to change verdicts, say why in the commit)::

    python -m harness.parity --world-size 4 --out reports/ws4
    python -m ci.record write default-w4 reports/ws4/parity.json

No difference is allowed, a fused optimizer's row included: its kernel rounds an element by its
offset in the tensor it is given, and its reference steps the candidate's shards
(``harness/parity/ranks/sides/optim/step_pieces.py``), so it is ``bitwise`` on every ISA (it once was
``staged`` on one and ``bitwise`` on another, and the record let the label swap).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from harness.parity.plan.config import ParityConfig

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "ci" / "baselines" / "record"
HEADER = ("configuration", "status", "closeness", "profile", "causes")


def _default(world_size: int) -> Callable[[], list[ParityConfig]]:
    def build() -> list[ParityConfig]:
        from harness.parity.plan.matrices import default

        return default.default_matrix(world_size=world_size)

    return build


def _resmlp() -> list[ParityConfig]:
    from harness.parity.plan.matrices import workload

    return workload.for_workload("fixtures.user_workloads:resmlp", world_size=2)


def _two_d() -> list[ParityConfig]:
    from harness.parity.plan.matrices import two_d

    return two_d.rows("llama", world_size=4, tp=2)


def _reshard() -> list[ParityConfig]:
    from harness.parity.plan.matrices import default

    return default.reshard()


MATRICES: dict[str, Callable[[], list[ParityConfig]]] = {
    "default-w2": _default(2),
    "default-w4": _default(4),
    "resmlp-w2": _resmlp,
    "two-d-w4": _two_d,
    "reshard": _reshard,
}
"""Each recorded matrix: what ``make parity`` (world sizes 2 and 4), a user's workload
(``--workload fixtures.user_workloads:resmlp``), ``make two-d`` and ``make reshard`` run."""


def path(name: str) -> Path:
    return FOLDER / f"{name}.tsv"


def read(name: str) -> list[tuple[str, ...]]:
    """The recorded rows of ``name`` (each ``HEADER``'s fields)."""
    lines = [line for line in path(name).read_text().splitlines() if line and not line.startswith("#")]
    assert tuple(lines[0].split("\t")) == HEADER, f"{path(name)}: header {lines[0]!r}"
    return [tuple(line.split("\t")) for line in lines[1:]]


def rows_of_report(report: dict[str, object]) -> list[tuple[str, ...]]:
    """The record's rows of a ``parity.json`` document."""
    return [
        (c["id"], c["status"], c["closeness"], c["profile"], ",".join(x["name"] for x in c["causes"]))
        for c in report["configs"]  # type: ignore[union-attr]
    ]


def rows_of_results(results: list[object]) -> list[tuple[str, ...]]:
    """The record's rows of ``ParityResult`` objects, in order."""
    return [
        (r.config.id, r.status, r.closeness, r.profile, ",".join(c.name for c in r.causes))  # type: ignore[attr-defined]
        for r in results
    ]


def write(name: str, rows: list[tuple[str, ...]]) -> None:
    FOLDER.mkdir(parents=True, exist_ok=True)
    text = ["# written by python -m ci.record write; read by suites/ci/test_record.py", "\t".join(HEADER)]
    path(name).write_text("\n".join(text + ["\t".join(row) for row in rows]) + "\n")


def differences(recorded: list[tuple[str, ...]], found: list[tuple[str, ...]]) -> list[str]:
    """Each way ``found`` differs from ``recorded``, in words."""
    if [r[0] for r in recorded] != [f[0] for f in found]:
        missing = sorted({r[0] for r in recorded} - {f[0] for f in found})
        extra = sorted({f[0] for f in found} - {r[0] for r in recorded})
        return [f"the configurations differ: missing {missing[:5]}, unexpected {extra[:5]} (or their order)"]
    said = []
    for want, got in zip(recorded, found, strict=True):
        for field, a, b in zip(HEADER[1:], want[1:], got[1:], strict=True):
            if a == b:
                continue
            said.append(f"{want[0]}: {field} {b!r}, recorded {a!r}")
    return said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.record", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("write", "check"))
    parser.add_argument("name", choices=sorted(MATRICES))
    parser.add_argument("report", type=Path, help="the parity.json of a run of that matrix")
    options = parser.parse_args(argv)
    rows = rows_of_report(json.loads(options.report.read_text()))
    if options.action == "write":
        write(options.name, rows)
        print(f"record: wrote {path(options.name)} ({len(rows)} configurations)")
        return 0
    found = differences(read(options.name), rows)
    print("\n".join(found) or f"record: {options.name} as recorded ({len(rows)} configurations)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
