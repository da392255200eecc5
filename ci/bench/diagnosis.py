"""How often the report is right about a planted bug: the diagnosis matrix (``fixtures/diagnosis.py``)
on a warm pool, rows naming the planted place and cause (and no rounding cause) out of all.

Why in ``make bench``: the suites assert every row (``suites/parity/test_diagnosis.py``: a sample
in ``make test``, every row at world sizes 2, 4 and 8 in ``make world-sizes``); this part prints
the accuracy by case and the time the matrix took, as information beside the other parts.
"""

from __future__ import annotations

import time
from typing import Any

from fixtures import diagnosis


class _PoolRanks:
    """The ``ranks`` fixture's ``run`` on a pool of our own (the diagnosis executors call it)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def run(
        self, func: Any, *args: Any, world_size: int = 2, backend: str = "gloo", deadline: float | None = None
    ) -> list[Any]:
        from harness import RankFailure
        from harness.controller.pool import CaseSpec
        from harness.outcome import judge
        from harness.spec import DistConfig

        config = DistConfig(
            world_size=world_size, backend=backend, deadline_s=deadline, collective_timeout_s=60.0
        )
        target = f"{func.__module__}:{func.__qualname__}"
        spec = CaseSpec.of(target, config, args=args, default_deadline_s=deadline or 300.0)
        verdict = judge(self.pool.run(spec), world_size=world_size)
        if verdict.outcome != "passed":
            raise RankFailure(verdict.message or verdict.summary)
        return verdict.values


def measure(world_sizes: tuple[int, ...] = (2, 4)) -> dict[str, Any]:
    """Every row of the matrix at ``world_sizes``, scored."""
    from harness.controller.pool import RankPool

    pool = RankPool(threads_per_rank=1)
    try:
        started = time.perf_counter()
        rows = [row for world in world_sizes for row in diagnosis.rows(world)]
        found = [diagnosis.scored(case, result) for case, result in diagnosis.run(_PoolRanks(pool), rows)]
        seconds = time.perf_counter() - started
    finally:
        pool.close()
    return {
        "world_sizes": list(world_sizes),
        "rows": len(found),
        "right": sum(s.right for s in found),
        "seconds": seconds,
        "wrong": [
            {"row": s.row, "status": s.status, "where": s.where, "causes": list(s.causes)}
            for s in found
            if not s.right
        ],
        "by_case": {
            case.name: {
                "rows": sum(s.case == case.name for s in found),
                "right": sum(s.right for s in found if s.case == case.name),
                "where": case.where,
                "cause": case.cause,
            }
            for case in diagnosis.CASES
        },
    }


def render(measured: dict[str, Any]) -> str:
    sizes = ", ".join(str(w) for w in measured["world_sizes"])
    lines = [f"diagnosis accuracy (planted bugs at world sizes {sizes}; {measured['seconds']:.0f} s)"]
    for name, case in measured["by_case"].items():
        lines.append(
            f"  {name:<24} {case['right']:>3} / {case['rows']:<3} ({case['where']}, {case['cause']})"
        )
    share = 100.0 * measured["right"] / measured["rows"] if measured["rows"] else 0.0
    lines.append(f"  {'all':<24} {measured['right']:>3} / {measured['rows']:<3} right: {share:.0f} %")
    lines += [
        f"  wrong: {w['row']}: {w['status']}, named {w['where']!r}, {w['causes']}" for w in measured["wrong"]
    ]
    return "\n".join(lines)
