"""The kernel-family tier (``python -m ci.kernels``): parity verdicts must not depend on which CPU
kernels ATen, MKL and oneDNN pick. Pure tests on made-up reports, and one real run of the sparse
configurations under ATen's scalar kernels (where a single-process reference over a batch of
another shape was 2.4e-7 off DDP while AVX2 machines said bitwise)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ci.kernels import settings, verdicts
from harness.parity.plan.config import Layout, ParityConfig, Precision
from suites.ci.support import SGD, report, result

ROOT = Path(__file__).resolve().parents[2]
BF16 = ParityConfig(
    engine="fsdp2", layout=Layout(reshard_after_forward=True), precision=Precision(dtype="bf16")
)


def _families(**documents):
    return dict(documents)


def test_identical_reports_hold_and_count_what_ran():
    document = report(result(SGD), result(BF16, status="skip"))
    comparison = verdicts.compare(_families(native=document, default=document))
    assert comparison.holds
    assert comparison.compared == 1
    assert comparison.counts["default"] == {"pass": 1, "skip": 1}


def test_a_configuration_that_fails_under_one_family_is_named_with_the_family():
    broken = report(result(SGD, status="fail"))
    comparison = verdicts.compare(_families(native=report(result(SGD)), default=broken))
    kinds = {(finding.kind, finding.configuration) for finding in comparison.findings}
    assert ("broken", SGD.id) in kinds
    assert ("status_differs", SGD.id) in kinds
    assert "fail under default" in comparison.findings[0].detail


def test_a_failure_under_every_family_is_still_a_finding():
    broken = report(result(SGD, status="fail"))
    comparison = verdicts.compare(_families(native=broken, default=broken))
    assert [finding.kind for finding in comparison.findings] == ["broken", "broken"]


def test_an_expected_failure_is_not_a_finding():
    document = report(result(SGD, status="fail"))
    document["configs"][0]["expected_failure"] = True
    assert verdicts.compare(_families(native=document, default=document)).holds


def test_a_scale_curve_that_moves_under_another_family_is_a_finding():
    moved = report(result(SGD, scales=(65536.0, 32768.0, 32768.0, 32768.0)))
    comparison = verdicts.compare(_families(native=report(result(SGD)), default=moved))
    assert [finding.kind for finding in comparison.findings] == ["scale_differs"]
    assert "default" in comparison.findings[0].detail


def test_a_last_bit_loss_difference_is_measured_but_holds():
    nudged = report(result(SGD, losses=((2.5000002, 2.4), (2.25, 2.2), (2.0, 1.9), (1.75, 1.7))))
    comparison = verdicts.compare(_families(native=report(result(SGD)), default=nudged))
    assert comparison.holds
    assert 0 < comparison.spread["fp32"] < 1e-6


def test_a_loss_outside_the_precision_tolerance_is_a_finding():
    moved = report(result(SGD, losses=((2.6, 2.4), (2.25, 2.2), (2.0, 1.9), (1.75, 1.7))))
    comparison = verdicts.compare(_families(native=report(result(SGD)), default=moved))
    assert [finding.kind for finding in comparison.findings] == ["curve_differs"]
    assert "fp32's tolerance" in comparison.findings[0].detail


def test_a_configuration_missing_from_one_family_is_a_finding():
    comparison = verdicts.compare(
        _families(native=report(result(SGD), result(BF16)), default=report(result(SGD)))
    )
    assert [(f.kind, f.configuration) for f in comparison.findings] == [("missing", BF16.id)]


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n\nprocessor\t: 1\n")
    assert settings.cpu_flags(cpuinfo) == {"fpu", "sse2", "avx2", "fma"}
    assert settings.cpu_flags(tmp_path / "missing") == frozenset()


def test_a_family_above_the_cpus_isa_is_unreachable_and_default_always_is():
    assert "lacks avx2" in settings.unreachable_reason(settings.BY_NAME["avx2"], frozenset({"sse2"}))
    assert settings.unreachable_reason(settings.BY_NAME["aten-default"], frozenset()) is None


def test_an_unknown_family_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown kernel setting 'avx1024'; choose from native, mkl-avx2"):
        settings.resolve(["avx1024"])


def test_a_familys_environment_replaces_the_callers_kernel_variables():
    base = {"PATH": "/bin", "MKL_ENABLE_INSTRUCTIONS": "AVX512", "ATEN_CPU_CAPABILITY": "avx512"}
    env = settings.environment(settings.BY_NAME["aten-default"], base)
    assert env == {"PATH": "/bin", "ATEN_CPU_CAPABILITY": "default"}


def test_aten_reports_its_scalar_kernels_under_the_default_family():
    env = settings.environment(settings.BY_NAME["aten-default"])
    assert settings.aten_capability(env) == "DEFAULT"


@pytest.mark.e2e
def test_the_sparse_configurations_keep_their_verdicts_under_atens_scalar_kernels(tmp_path):
    """The regression itself: the single-process sparse reference must run the candidate's shapes
    (a family alone is held to no failure; the native kernels ran in the suites already). A run of
    the command with its own ranks: ``make e2e`` (``make kernels`` runs the whole matrix so)."""
    command = [sys.executable, "-m", "ci.kernels", "--settings", "aten-default", "-k", "sparse"]
    completed = subprocess.run(
        [*command, "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    document = json.loads((tmp_path / "kernels.json").read_text())
    assert document["findings"] == []
    assert document["compared"] == 2
    assert document["counts"]["aten-default"] == {"pass": 2, "skip": 1}
    assert document["runs"]["aten-default"]["aten"] == "DEFAULT"
    assert "same verdict" in (tmp_path / "kernels.md").read_text()


def test_bad_arguments_exit_2_naming_the_fix(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "ci.kernels", "--settings", "avx1024", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 2
    assert "unknown kernel setting 'avx1024'" in completed.stderr


def test_a_workloads_matrix_runs_under_each_family_with_its_recipes():
    from ci.kernels.__main__ import parity_command, parse_args

    options = parse_args(["--workload", "llama", "-k", "autocast", "--settings", "aten-default"])
    command = parity_command(options, Path("out"))
    assert command[command.index("--workload") + 1] == "llama"
    assert command[command.index("-k") + 1] == "autocast"
