"""Harness overhead: a trivial 2-rank gloo test (one all_reduce) under our warm pool vs PyTorch's
``MultiProcessTestCase``, both run by pytest in the same run; plus an NCCL test skipped at
collection; and the self-tests' ``MultiProcessTestCase``-style class
(``suites/harness/test_testcase_mpc_style.py``) on both bases, ``harness.DistributedTestCase`` and
torch's, in the same run (``"testcase"`` in the measured numbers). Called by ``make bench`` (``python -m ci.bench``) through :func:`measure` and
:func:`render`.

Per-test times come from the JUnit XML of each inner session (setup + call + teardown, as pytest
times them). Our first test also starts the pool, so it is reported apart (cold start) and the
per-test figure is the mean of the other warm tests. ``MultiProcessTestCase`` spawns fresh ranks
for every test, so it is measured over fewer tests (``MPC_TESTS``) to keep the run short.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

OUR_TESTS = 50
MPC_TESTS = 5
SKIPPED_TESTS = 50

OURS = f"""
import pytest, torch, torch.distributed as dist, harness

@harness.distributed(world_size=2, backend="gloo")
@pytest.mark.parametrize("i", range({OUR_TESTS}))
def test_all_reduce(i):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2.0

@harness.distributed(world_size=2, backend="nccl")
@pytest.mark.parametrize("i", range({SKIPPED_TESTS}))
def test_nccl_skipped(i):
    raise AssertionError("never runs without 2 GPUs")
"""

MPC = """
import os, torch, torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase

class TestMPC(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def tearDown(self):
        super().tearDown()
        try:
            os.remove(self.file_name)
        except OSError:
            pass

    def _all_reduce(self):
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == 2.0
        dist.destroy_process_group()

""" + "".join(f"    def test_all_reduce_{i}(self):\n        self._all_reduce()\n\n" for i in range(MPC_TESTS))


def _run(directory: Path, name: str, source: str) -> tuple[dict[str, tuple[str, float]], float]:
    """Run one inner pytest session; return ``{test: (outcome, seconds)}`` and its wall time."""
    (directory / f"{name}.py").write_text(source)
    junit = directory / f"{name}.xml"
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", f"{name}.py", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    wall = time.perf_counter() - started
    if not junit.exists():
        raise RuntimeError(f"inner session {name} wrote no report:\n{proc.stdout}\n{proc.stderr}")
    times = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = next(
            (child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed"
        )
        times[case.get("name")] = (outcome, float(case.get("time", "0")))
    return times, wall


def measure() -> dict[str, float | int]:
    with tempfile.TemporaryDirectory(prefix="shardscale-bench-") as tmp:
        directory = Path(tmp)
        ours, ours_wall = _run(directory, "test_bench_ours", OURS)
        mpc, mpc_wall = _run(directory, "test_bench_mpc", MPC)
    runs = [t for n, (o, t) in ours.items() if n.startswith("test_all_reduce") and o == "passed"]
    skips = [t for n, (o, t) in ours.items() if n.startswith("test_nccl_skipped") and o == "skipped"]
    mpc_runs = [t for o, t in mpc.values() if o == "passed"]
    if len(runs) != OUR_TESTS or len(skips) != SKIPPED_TESTS or len(mpc_runs) != MPC_TESTS:
        raise RuntimeError(f"unexpected outcomes: ours={ours} mpc={mpc}")
    warm = runs[1:]
    return {
        "testcase": measure_testcase(),
        "our_tests": OUR_TESTS,
        "mpc_tests": MPC_TESTS,
        "skipped_tests": SKIPPED_TESTS,
        "ratio_mpc_per_ours": statistics.fmean(mpc_runs) / statistics.fmean(warm),
        "ours_cold_s": runs[0],
        "ours_warm_mean_s": statistics.fmean(warm),
        "ours_warm_median_s": statistics.median(warm),
        "ours_wall_s": ours_wall,
        "skipped_mean_s": statistics.fmean(skips),
        "mpc_mean_s": statistics.fmean(mpc_runs),
        "mpc_wall_s": mpc_wall,
    }


def render(m: dict[str, float | int]) -> str:
    ratio = m["ratio_mpc_per_ours"]
    rows = [
        (
            "harness (warm pool), 2-rank gloo all_reduce",
            f"{m['ours_warm_mean_s'] * 1e3:9.1f} ms",
            f"{m['our_tests'] - 1}",
        ),
        ("harness, first test (starts the pool)", f"{m['ours_cold_s'] * 1e3:9.1f} ms", "1"),
        (
            "harness, NCCL test skipped at collection",
            f"{m['skipped_mean_s'] * 1e3:9.2f} ms",
            f"{m['skipped_tests']}",
        ),
        ("MultiProcessTestCase, same test", f"{m['mpc_mean_s'] * 1e3:9.1f} ms", f"{m['mpc_tests']}"),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"{'harness overhead (per test)':<{width}}  {'time':>12}  tests", "-" * (width + 21)]
    lines += [f"{name:<{width}}  {value:>12}  {count:>5}" for name, value, count in rows]
    lines.append("-" * (width + 21))
    lines.append(f"ratio MultiProcessTestCase / harness (warm): {ratio:.0f}x  (target >= 30x)")
    lines.append(
        f"targets: warm < 50 ms: {'ok' if m['ours_warm_mean_s'] < 0.05 else 'MISSED'}; "
        f"skipped < 10 ms: {'ok' if m['skipped_mean_s'] < 0.01 else 'MISSED'}; "
        f"ratio >= 30x: {'ok' if ratio >= 30 else 'MISSED'}"
    )
    lines.append(
        f"(MultiProcessTestCase measured over {m['mpc_tests']} tests only, to keep the run short; "
        f"session wall times: harness {m['ours_wall_s']:.1f} s for {m['our_tests'] + m['skipped_tests']} tests, "
        f"MultiProcessTestCase {m['mpc_wall_s']:.1f} s for {m['mpc_tests']}; JUnit times, 1 ms resolution)"
    )
    if "testcase" in m:
        lines += ["", render_testcase(m["testcase"])]
    return "\n".join(lines)


# -- one MultiProcessTestCase-style class on both bases ----------------------------------------------
MPC_STYLE = Path(__file__).resolve().parents[2] / "suites" / "harness" / "test_testcase_mpc_style.py"
OUR_BASE = "from harness import DistributedTestCase as Base"
TORCH_BASE = "from torch.testing._internal.common_distributed import MultiProcessTestCase as Base"


def measure_testcase() -> dict[str, float | int]:
    """Per-test times of the self-tests' ``MultiProcessTestCase``-style class, run by pytest as it is
    (``harness.DistributedTestCase``) and with its one base-class import swapped for torch's."""
    source = MPC_STYLE.read_text()
    if OUR_BASE not in source:
        raise RuntimeError(f"{MPC_STYLE} must import its base class as {OUR_BASE!r}, the line swapped here")
    with tempfile.TemporaryDirectory(prefix="shardscale-bench-") as tmp:
        ours, _ = _run(Path(tmp), "test_mpc_style_ours", source)
        torch_base, _ = _run(Path(tmp), "test_mpc_style_torch", source.replace(OUR_BASE, TORCH_BASE))
    if set(ours) != set(torch_base) or {o for o, _ in [*ours.values(), *torch_base.values()]} != {"passed"}:
        raise RuntimeError(f"unexpected outcomes: ours={ours} torch={torch_base}")
    times = [t for _, t in ours.values()]  # execution order: the first test also starts the pool
    warm = statistics.fmean(times[1:])
    mpc = statistics.fmean(t for _, t in torch_base.values())
    return {"tests": len(times), "ours_cold_s": times[0], "ours_warm_mean_s": warm, "mpc_mean_s": mpc}


def render_testcase(m: dict[str, float | int]) -> str:
    rows = [
        ("harness.DistributedTestCase (warm pool)", f"{m['ours_warm_mean_s'] * 1e3:9.1f} ms", m["tests"] - 1),
        ("harness.DistributedTestCase, first test (starts the pool)", f"{m['ours_cold_s'] * 1e3:9.1f} ms", 1),
        ("MultiProcessTestCase", f"{m['mpc_mean_s'] * 1e3:9.1f} ms", m["tests"]),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [
        f"{'one MultiProcessTestCase-style class, per test':<{width}}  {'time':>12}  tests",
        "-" * (width + 21),
    ]
    lines += [f"{name:<{width}}  {value:>12}  {count:>5}" for name, value, count in rows]
    lines.append("-" * (width + 21))
    ratio = m["mpc_mean_s"] / m["ours_warm_mean_s"]
    lines.append(f"ratio MultiProcessTestCase / DistributedTestCase (warm): {ratio:.0f}x")
    lines.append(
        "(suites/harness/test_testcase_mpc_style.py, run unchanged except for its base class import; "
        "JUnit times, 1 ms resolution)"
    )
    return "\n".join(lines)


def main() -> int:
    print(render(measure()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
