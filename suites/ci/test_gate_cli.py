"""``python -m ci.gate`` as CI runs it: exit 0 when everything holds, 1 naming each regression
(configuration, metric, first diverging step, expected vs got), 2 for usage and infrastructure
errors; drift from another torch version labelled as drift. Most tests compare fabricated reports
(``--from-report``); the last ones run real tests on ranks."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ci.gate import baselines, cli
from suites.ci.support import ADAM_BF16, SGD, result, write_baseline, write_report

ROOT = Path(__file__).resolve().parents[2]
MOVED = result(losses=((2.5, 2.4), (2.25, 2.2), (2.0, 2.0), (1.75, 1.8)))


def gate(*args, cwd=ROOT):
    """The gate as CI runs it: a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "ci.gate", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture
def compare(capsys):
    """The gate in this process, for runs that start no rank (arguments, ``--from-report``): the
    same ``main`` as ``python -m ci.gate``, without an interpreter start per call."""

    def run(*args):
        try:
            code = cli.main([str(arg) for arg in args])
        except SystemExit as exit:  # argparse's usage errors
            code = exit.code
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out, out.err)

    return run


@pytest.fixture
def report_file(tmp_path):
    return write_report(tmp_path / "parity.json", result())


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--require-gpus", "2"], "--require-gpus applies to the GPU tier only; add --gpu"),
        (["--gpu", "--require-gpus", "0"], "--require-gpus must be >= 1, got 0"),
        (
            ["--from-report", "nowhere.json"],
            "--from-report nowhere.json: no such file; run make parity or the gate first",
        ),
        (
            ["--from-report", "REPORT", "-k", "fsdp2"],
            "--from-report compares a report; it takes no test selection",
        ),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_arguments_exit_2_naming_the_fix(tmp_path, report_file, args, complaint, compare):
    done = compare(*[str(report_file) if a == "REPORT" else a for a in args], "--out", tmp_path / "out")
    assert done.returncode == 2 and complaint in done.stderr, done.stderr


def test_a_backend_without_baselines_exits_2_naming_the_fix(tmp_path, report_file, compare):
    done = compare("--from-report", report_file, "--baselines", tmp_path / "empty", "--out", tmp_path / "out")
    assert done.returncode == 2
    assert f"no baselines for backend gloo under {tmp_path / 'empty' / 'gloo'}" in done.stderr
    assert "python -m ci.gate --update-baselines" in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA GPUs")
def test_the_gpu_tier_on_a_machine_without_gpus_exits_2_before_running_anything(tmp_path, compare):
    done = compare("--gpu", "--out", tmp_path / "out")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--gpu requires 2 CUDA GPUs (--require-gpus), this machine has 0" in done.stderr
    assert not (tmp_path / "out" / "junit.xml").exists()


def test_a_deviating_curve_exits_1_naming_configuration_metric_step_expected_and_got(tmp_path, compare):
    write_baseline(tmp_path / "baselines", "2.13.0", result())
    report = write_report(tmp_path / "parity.json", MOVED)
    done = compare("--from-report", report, "--baselines", tmp_path / "baselines", "--out", tmp_path / "out")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert (
        f"  CURVE    {SGD.id}  loss[rank 1] first differs at step 2 (2 of 4 steps): "
        "expected 1.9 ± 1.2e-05, got 2.0 (abs 0.1, rel 0.0526)"
    ) in lines
    assert lines[-1] == "gate: FAIL (exit 1): 1 curve finding(s)"
    verdict = json.loads((tmp_path / "out" / "gate.json").read_text())
    assert verdict["exit_code"] == 1 and verdict["baseline"]["exact"] is True
    (finding,) = verdict["curves"]["findings"]
    assert (finding["kind"], finding["metric"], finding["step"], finding["expected"], finding["got"]) == (
        "regression",
        "loss[rank 1]",
        2,
        1.9,
        2.0,
    )
    junit = (tmp_path / "out" / "baselines.xml").read_text()
    assert f'name="{SGD.id}"' in junit and 'failures="1"' in junit


def test_matching_curves_exit_0_and_say_that_parity_and_scaling_hold(tmp_path, report_file, compare):
    write_baseline(tmp_path / "baselines", "2.13.0", result())
    done = compare(
        "--from-report", report_file, "--baselines", tmp_path / "baselines", "--out", tmp_path / "out"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(torch 2.13.0, same torch): all within tolerance" in done.stdout
    assert done.stdout.splitlines()[-1] == "gate: PASS (exit 0): parity and scaling hold"


def test_another_torch_version_is_compared_with_the_nearest_baseline_and_labelled_drift(tmp_path, compare):
    write_baseline(tmp_path / "baselines", "2.13.0", result())
    write_baseline(tmp_path / "baselines", "2.6.0", MOVED)
    report = write_report(tmp_path / "parity.json", MOVED, torch="2.14.1+cpu")
    done = compare("--from-report", report, "--baselines", tmp_path / "baselines", "--out", tmp_path / "out")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "torch-2.13.0.csv (torch 2.13.0, nearest to torch 2.14.1: differences are drift)" in done.stdout
    assert (
        "drift (torch 2.14.1 against the baselines of torch 2.13.0; not a failure; "
        "record this version's with --update-baselines):"
    ) in done.stdout
    assert f"  DRIFT    {SGD.id}  loss[rank 1] first differs at step 2" in done.stdout
    assert "CURVE" not in done.stdout
    strict = compare(
        "--from-report",
        report,
        "--baselines",
        tmp_path / "baselines",
        "--out",
        tmp_path / "o2",
        "--fail-on-drift",
    )
    assert strict.returncode == 1 and "failing the gate (--fail-on-drift)" in strict.stdout


def test_update_baselines_records_this_torch_version_and_leaves_out_what_broke(tmp_path, compare):
    write_baseline(tmp_path / "baselines", "2.13.0", result())
    broken = result(ADAM_BF16, status="fail")
    report = write_report(tmp_path / "parity.json", MOVED, broken, torch="2.14.1")
    done = compare(
        "--from-report",
        report,
        "--baselines",
        tmp_path / "baselines",
        "--out",
        tmp_path / "out",
        "--update-baselines",
    )
    written = tmp_path / "baselines" / "gloo" / "torch-2.14.1.csv"
    assert f"updated   {written}" in done.stdout
    assert f"not recorded (they broke): {ADAM_BF16.id}" in done.stdout
    assert set(baselines.read(written)) == {SGD.id}
    assert done.returncode == 1 and f"MISSING  {ADAM_BF16.id}" in done.stdout  # it broke: no baseline yet
    again = compare("--from-report", report, "--baselines", tmp_path / "baselines", "--out", tmp_path / "o2")
    assert "(torch 2.14.1, same torch)" in again.stdout and "CURVE" not in again.stdout


def test_ranks_that_cannot_start_exit_2_before_any_test_runs(tmp_path, monkeypatch, capsys):
    from ci.gate import preflight

    monkeypatch.setattr(
        preflight, "check_ranks", lambda backend, world_size: "the ranks could not be started: boom"
    )
    monkeypatch.setattr(cli.process, "call", lambda *a, **k: pytest.fail("pytest must not run"))
    assert cli.main(["--out", str(tmp_path / "out")]) == 2
    assert "gate: ERROR (exit 2): the ranks could not be started: boom" in capsys.readouterr().err


@pytest.mark.e2e
def test_a_selection_that_runs_no_test_exits_2(tmp_path):
    done = gate("suites/ci/test_gate_curves.py", "-k", "no_such_test", "--out", tmp_path / "out")
    assert done.returncode == 2 and "the selection ran no test" in done.stderr, done.stdout + done.stderr


@pytest.mark.e2e
def test_a_failing_test_exits_1_and_is_named_with_its_first_line(tmp_path):
    (tmp_path / "test_boom.py").write_text("def test_boom():\n    assert 1 + 1 == 3\n")
    done = gate(tmp_path / "test_boom.py", "--out", tmp_path / "out")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "tests     0 passed, 1 failed, 0 skipped" in done.stdout
    # The id is relative to the rootdir pytest chose, which depends on where the checkout and the
    # temporary folder lie: only its end is fixed.
    failed = [line for line in done.stdout.splitlines() if line.startswith("  FAILED   ")]
    assert len(failed) == 1 and failed[0].endswith("test_boom.py::test_boom: assert (1 + 1) == 3"), failed
    assert done.stdout.splitlines()[-1] == "gate: FAIL (exit 1): 1 test(s) failed"


@pytest.mark.e2e
def test_a_real_run_writes_junit_properties_and_reports_and_matches_the_committed_baselines(tmp_path):
    config = "fsdp2-reshard-fp32-sgd-w2"
    done = gate("suites/parity/test_fsdp_vs_ddp.py", "-k", config, "--out", tmp_path / "out", "--no-plot")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "parity    1 configuration(s): 1 pass" in done.stdout
    assert "curves    1 compared with " in done.stdout and "all within tolerance" in done.stdout
    junit = (tmp_path / "out" / "junit.xml").read_text()
    assert f'<property name="parity.configuration" value="{config}"' in junit
    assert '<property name="parity.status" value="pass"' in junit
    report = json.loads((tmp_path / "out" / "parity.json").read_text())
    assert [c["id"] for c in report["configs"]] == [config] and report["run"]["filter"] == config
    assert (tmp_path / "out" / "parity.md").exists() and not (tmp_path / "out" / "parity.png").exists()


@pytest.mark.e2e
def test_a_gate_stopped_with_sigterm_stops_its_pytest_session(tmp_path):
    """CI cancels a job with SIGTERM to the gate: its pytest session (and that one's ranks) must
    not live on."""
    import os
    import signal
    import time

    pid_file = tmp_path / "pid"
    (tmp_path / "test_sleeps.py").write_text(
        "import os, time\n"
        f"def test_sleeps():\n    open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n    time.sleep(600)\n"
    )
    gate_process = subprocess.Popen(
        [sys.executable, "-m", "ci.gate", str(tmp_path / "test_sleeps.py"), "--out", str(tmp_path / "out")],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 300
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            assert gate_process.poll() is None, "the gate ended before its test started"
            time.sleep(0.2)
        session = int(pid_file.read_text())
        gate_process.send_signal(signal.SIGTERM)
        assert gate_process.wait(timeout=60) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                os.kill(session, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
        pytest.fail(f"the gate's pytest session {session} outlived it")
    finally:
        if gate_process.poll() is None:
            gate_process.kill()
