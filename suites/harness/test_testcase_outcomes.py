"""``DistributedTestCase`` outcomes seen from outside: the classes of ``inner_testcase.py`` run as an
inner pytest session (once for the module), under ``python -m unittest`` and as a script; the
collection-time skips of ``inner_testcase_collection.py`` in a session that must start no process;
and ``EXPECTTEST_ACCEPT=1`` rewriting a copy of a test file from rank 0 alone."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from suites.harness.selftest import harness_spawns, inner_env, junit_outcomes, log_spawns, wait_until_gone

# Inner unittest and pytest sessions (a minute and more on two cores): `make e2e`. DistributedTestCase
# in process stays in `make test` (test_testcase.py, test_testcase_mpc_style.py).
pytestmark = pytest.mark.e2e

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """The inner pytest session over ``inner_testcase.py``: ``{test: (kind, text)}`` and its output."""
    out = tmp_path_factory.mktemp("testcase")
    junit = out / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(HERE / "inner_testcase.py"), "-p", "no:cacheprovider", "-q"]
        + ["-rA", f"--junitxml={junit}", f"--rank-logs={out / 'rank-logs'}"],
        cwd=ROOT,
        env=inner_env(uuid.uuid4().hex, out),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert junit.exists(), proc.stdout[-5000:] + proc.stderr[-3000:]
    return {"outcomes": junit_outcomes(junit), "out": proc.stdout, "dir": out}


def skipped_with(session, name, reason):
    kind, text = outcome(session, name)
    return kind == "skipped" and reason in text


def outcome(session, name):
    outcomes = session["outcomes"]
    assert name in outcomes, f"{name} not in {sorted(outcomes)}\n{session['out'][-3000:]}"
    return outcomes[name]


def test_a_failing_rank_fails_the_test_naming_the_rank(session):
    kind, text = outcome(session, "test_rank1_fails")
    assert kind == "failure"
    assert "root cause: rank 1 failed: AssertionError: rank 1 disagrees" in text
    assert "ranks that passed: [0]" in text
    assert "reproduce: " in text and "inner_testcase.py::TestOneRankFails::test_rank1_fails" in text


def test_a_failure_whose_message_spans_lines_is_named_by_its_type_and_first_line(session):
    kind, text = outcome(session, "test_rank1_raises_a_multi_line_message")
    assert kind == "failure"
    assert (
        "root cause: rank 1 failed: NotImplementedError: "
        "Could not run 'aten::eq.Tensor' with arguments from the 'SparseCPU' backend.\n" in text
    ), text
    assert "[rank 1] PythonDispatcher: registered at" in text, "the full report stays below"


def test_the_failure_shows_the_test_methods_traceback_without_harness_frames(session):
    kind, text = outcome(session, "test_rank1_fails")
    line = (
        (HERE / "inner_testcase.py")
        .read_text()
        .splitlines()
        .index('            self.fail("rank 1 disagrees")')
    )
    assert f'inner_testcase.py", line {line + 1}, in test_rank1_fails' in text, text
    assert "testcase_rank.py" not in text and "unittest/case.py" not in text, text


def test_a_skip_on_some_ranks_only_fails_the_test(session):
    kind, text = outcome(session, "test_rank0_skips")
    assert kind == "failure"
    assert (
        "rank 0 skipped ('only rank 0 wants to skip') while other ranks did not: an asymmetric skip" in text
    )


def test_a_skip_on_every_rank_skips_the_test_with_its_reason(session):
    assert skipped_with(session, "test_every_rank_skips", "nothing to do on 2 ranks")


def test_torchs_skip_decorators_skip_on_every_rank(session):
    if _gpus() >= 2:
        pytest.skip(f"this machine has {_gpus()} CUDA GPUs: torch's skip decorators let the tests run")
    assert skipped_with(session, "test_torch_skip_if_lt_x_gpu", "Need at least 2 CUDA devices")
    assert skipped_with(session, "test_torch_skip_if_no_gpu", "CUDA is not available.")


def test_set_up_failing_on_one_rank_fails_the_test_without_its_peers_waiting_for_the_collective_timeout(
    session,
):
    """Rank 1's ``setUp`` raises while rank 0 enters ``all_reduce`` (collective timeout 60 s): rank 1
    leaves the group and reports at once, so rank 0 fails or is stopped well before 60 s."""
    kind, text = outcome(session, "test_all_reduce_after_set_up")
    assert kind == "failure"
    assert "root cause: rank 1 failed: RuntimeError: rank 1 cannot set up" in text
    assert "Timed out waiting 60000ms" not in text, text


def test_tear_down_runs_on_every_rank(session):
    assert outcome(session, "test_passes") == ("passed", "")
    assert sorted(p.name for p in session["dir"].glob("tear-down-pytest-rank*")) == [
        "tear-down-pytest-rank0",
        "tear-down-pytest-rank1",
    ]


def test_a_rank_past_the_deadline_fails_the_test_with_every_ranks_stack(session):
    kind, text = outcome(session, "test_rank1_hangs")
    assert kind == "failure"
    assert "root cause: rank 1 did not finish before the deadline" in text
    assert "[rank 1] Python stacks at the deadline:" in text and "in test_rank1_hangs" in text
    assert "[rank 0] Python stacks at the deadline:" in text


def test_the_next_test_after_a_deadline_runs_on_fresh_ranks(session):
    assert outcome(session, "test_runs_on_fresh_ranks") == ("passed", "")


def test_init_process_group_with_another_world_size_fails_naming_both(session):
    kind, text = outcome(session, "test_init_with_four")
    assert kind == "failure"
    assert (
        "calls dist.init_process_group(world_size=4) but TestInitWithAnotherWorldSize.world_size is 2: "
        "the warm pool runs the class's tests on 2 ranks; set world_size = 4 on the class" in text
    )


def test_a_bad_class_attribute_is_an_error_of_its_tests_and_the_others_run(session):
    kind, text = outcome(session, "test_never_runs")
    assert kind == "error"
    assert (
        "invalid TestBadWorldSize (a harness.DistributedTestCase): world_size must be an int >= 1, got 0"
        in text
    )
    assert outcome(session, "test_runs_on_fresh_ranks")[0] == "passed"


def test_expected_failure_is_an_xfail(session):
    kind, text = outcome(session, "test_expected_failure")
    assert kind == "skipped" and "expected failure: AssertionError: 0 != -1" in text


def test_unexpected_success_fails(session):
    kind, text = outcome(session, "test_unexpected_success")
    assert kind == "failure" and "is marked @unittest.expectedFailure but passed" in text


def test_each_failing_subtest_is_reported_with_its_parameters(session):
    kind, text = outcome(session, "test_subtests_each_reported")
    assert kind == "failure"
    assert (
        "1 part of suites.harness.inner_testcase.TestUnittestOutcomes.test_subtests_each_reported failed:"
        in text
    )
    assert "(value=1) ----" in text and "AssertionError: 1 == 1 : value 1 is wrong" in text
    assert "(value=0)" not in text and "(value=2)" not in text


def test_parameterized_ids_are_test_names_for_k(session, tmp_path):
    """``parameterized.expand`` names methods, ``parameterized_class`` names classes: ``-k`` picks one."""
    assert outcome(session, "test_expanded_0_small") == ("passed", "")
    assert outcome(session, "test_expanded_1_large") == ("passed", "")
    files = [str(HERE / "inner_testcase.py"), str(HERE / "test_testcase.py")]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *files, "-p", "no:cacheprovider"]
        + ["--collect-only", "-q", "-k", "expanded_1 or TestParameterizedClass_1"],
        cwd=ROOT,
        env=inner_env(uuid.uuid4().hex, tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    selected = [line for line in proc.stdout.splitlines() if "::" in line]
    assert selected == [
        "suites/harness/inner_testcase.py::TestUnittestOutcomes::test_expanded_1_large",
        "suites/harness/test_testcase.py::TestParameterizedClass_1::test_each_class_runs_in_its_world",
    ], proc.stdout


def test_torchs_test_case_mixed_in_gives_its_tensor_assert_equal(session):
    assert outcome(session, "test_tensor_assert_equal") == ("passed", "")


def test_tensor_assert_equal_in_the_ranks_is_torchs_with_the_base_class_alone(session):
    assert outcome(session, "test_tensor_assert_equal_without_torchs_test_case") == ("passed", "")


# -- collection-time skips -----------------------------------------------------------------------
def test_gpu_skips_are_decided_at_collection_starting_no_process(tmp_path):
    if _gpus():
        pytest.skip(f"needs a machine without CUDA GPUs (this one has {_gpus()})")
    log = tmp_path / "spawn.log"
    junit = tmp_path / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(HERE / "inner_testcase_collection.py"), "-p", "no:cacheprovider"]
        + ["-q", "-rA", f"--junitxml={junit}"],
        cwd=ROOT,
        env=log_spawns(inner_env(uuid.uuid4().hex, tmp_path), tmp_path, log),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout
    outcomes = junit_outcomes(junit)
    reasons = {
        "test_needs_64_gpus": "skip_if_lt_x_gpu(64): this machine has 0 CUDA GPUs",
        "test_unittest_skip": "skipped by unittest",
        "test_one": "skip_if_lt_x_gpu(64): this machine has 0 CUDA GPUs",
        "test_nccl": "nccl world size 2 needs 2 CUDA GPUs, this machine has 0",
    }
    assert set(outcomes) == set(reasons)
    for name, reason in reasons.items():
        assert outcomes[name][0] == "skipped" and reason in outcomes[name][1], (name, outcomes[name])
    lines = log.read_text().splitlines()
    assert lines[0].split(" ", 2)[:2] == [str(proc_pid(log)), "started"], lines
    assert harness_spawns(lines, proc_pid(log)) == [], lines


def proc_pid(log: Path) -> int:
    return int(log.read_text().split(" ", 1)[0])


def test_gpu_tests_fail_in_strict_mode_without_gpus(tmp_path):
    if _gpus():
        pytest.skip(f"needs a machine without CUDA GPUs (this one has {_gpus()})")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(HERE / "inner_testcase_collection.py"), "-p", "no:cacheprovider"]
        + ["-q", "-rA", "-m", "gpu", "--require-gpus", "2"],
        cwd=ROOT,
        env=inner_env(uuid.uuid4().hex, tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout
    assert "ERROR inner_testcase_collection.py::TestNcclNeedsGpus::test_nccl" in proc.stdout.replace(
        "suites/harness/", ""
    ), proc.stdout
    assert "strict GPU mode (--require-gpus 2): nccl world size 2 needs 2 CUDA GPUs, this machine has 0" in (
        proc.stdout
    )
    assert "2 skipped" in proc.stdout, "skip_if_lt_x_gpu(64) needs more GPUs than required: still a skip"


# -- python -m unittest ---------------------------------------------------------------------------
UNITTEST_SELECTION = ["TestOneRankFails", "TestTearDownRunsOnEveryRank", "TestEveryRankSkips"]


def run_unittest(tmp_path, *command):
    tag = uuid.uuid4().hex
    env = inner_env(tag, tmp_path)
    env["SHARDSCALE_SELFTEST_RUN"] = "unittest"
    proc = subprocess.run(
        [sys.executable, *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    return proc, tag


@pytest.mark.parametrize(
    "command",
    [
        ["-m", "unittest", *(f"suites.harness.inner_testcase.{name}" for name in UNITTEST_SELECTION)],
        ["suites/harness/inner_testcase.py", *UNITTEST_SELECTION],
    ],
    ids=["python-m-unittest", "script-calling-unittest-main"],
)
def test_unittest_runs_the_methods_on_its_own_pool_and_leaves_no_process(tmp_path, command):
    proc, tag = run_unittest(tmp_path, *command)
    err = proc.stderr
    assert proc.returncode == 1, err
    assert "Ran 5 tests" in err and "FAILED (failures=1, skipped=" in err, err
    assert "root cause: rank 1 failed: AssertionError: rank 1 disagrees" in err, err
    assert "reproduce: cd " in err and "TestOneRankFails.test_rank1_fails" in err, err
    assert sorted(p.name for p in tmp_path.glob("tear-down-unittest-rank*")) == [
        "tear-down-unittest-rank0",
        "tear-down-unittest-rank1",
    ]
    assert wait_until_gone(tag) == [], "the unittest run left processes behind"


def test_pytest_without_the_plugin_runs_the_methods_on_a_pool_of_its_own(tmp_path):
    tag = uuid.uuid4().hex
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(HERE / "inner_testcase.py"), "-p", "no:shardscale"]
        + ["-p", "no:cacheprovider", "-q", "-k", "TestOneRankFails or TestTearDownRunsOnEveryRank"],
        cwd=ROOT,
        env=inner_env(tag, tmp_path),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 1, proc.stdout
    assert "1 failed, 1 passed" in proc.stdout, proc.stdout
    assert (
        "RankFailure: 1 of 2 ranks did not pass; root cause: rank 1 failed: AssertionError: rank 1 disagrees"
        in (proc.stdout)
    )
    assert "Incompatible Exception Representation" not in proc.stdout, proc.stdout
    assert wait_until_gone(tag) == [], "the session left processes behind"


# -- expecttest ------------------------------------------------------------------------------------
EXPECT_SOURCE = '''import torch.distributed as dist

import harness


class TestExpect(harness.DistributedTestCase):
    world_size = 2

    def test_text(self):
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, self.rank)
        self.assertExpectedInline(str(gathered), """old""")
        self.assertExpectedInline("\\n".join(["a", "b"]), """a""")
        self.assertExpectedInline("last", """old""")
'''
EXPECT_ACCEPTED = '''import torch.distributed as dist

import harness


class TestExpect(harness.DistributedTestCase):
    world_size = 2

    def test_text(self):
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, self.rank)
        self.assertExpectedInline(str(gathered), """[0, 1]""")
        self.assertExpectedInline("\\n".join(["a", "b"]), """\\
a
b""")
        self.assertExpectedInline("last", """last""")
'''


def test_expecttest_accept_rewrites_the_source_once_from_rank_0(tmp_path):
    test_file = tmp_path / "test_expect.py"
    test_file.write_text(EXPECT_SOURCE)
    env = {**inner_env(uuid.uuid4().hex, tmp_path), "EXPECTTEST_ACCEPT": "1"}
    command = [sys.executable, "-m", "pytest", str(test_file), "-p", "no:cacheprovider", "-q", "-rP"]
    accept = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert accept.returncode == 0, accept.stdout
    assert test_file.read_text() == EXPECT_ACCEPTED, test_file.read_text()
    assert accept.stdout.count("[rank 0] Accepting new output") == 3, accept.stdout
    assert "[rank 1] Accepting new output" not in accept.stdout, accept.stdout
    env.pop("EXPECTTEST_ACCEPT")
    check = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout
