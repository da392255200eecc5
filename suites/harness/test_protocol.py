"""Unit tests of the wire protocol, the verdict rules and argument checks (no processes)."""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys

import pytest

import harness
from harness.failure_text import headline, headline_of_text
from harness.outcome import RankResult, describe_exit, judge
from harness.protocol import (
    MESSAGE_TYPES,
    Ack,
    CaseFinished,
    Heartbeat,
    InitGroup,
    LeaveGroup,
    Placeholder,
    RankCrashed,
    RankStarted,
    RunCase,
    Shutdown,
    from_wire,
)
from harness.spec import DistConfig, expand, from_marker

EXAMPLES = [
    InitGroup(backend="gloo", world_size=4, prefix="s/g1", collective_timeout_s=12.5),
    LeaveGroup(),
    RunCase(
        case_id=7,
        target="mod:func",
        args=(1, "x"),
        kwargs={"rank": Placeholder.RANK, "n": 3},
        sys_path=("/a", "/b"),
        prefix="s/case7",
        collective_timeout_s=3.0,
    ),
    Shutdown(),
    RankStarted(rank=3, pid=4242),
    Ack(rank=1, command="init_group", error="Traceback ..."),
    CaseFinished(
        case_id=7,
        rank=1,
        status="failed",
        value=None,
        text="[rank 1] boom",
        headline="ValueError: boom",
        duration_s=0.25,
    ),
    Heartbeat(case_id=7, rank=1),
    RankCrashed(rank=0, exitcode=-11),
]


def test_examples_cover_every_message_type():
    assert {type(m) for m in EXAMPLES} == set(MESSAGE_TYPES)


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: m.kind)
def test_round_trip_keeps_every_field(message):
    wire = pickle.loads(pickle.dumps(message.to_wire()))
    assert wire["kind"] == message.kind
    back = from_wire(wire)
    assert back == message
    for field in dataclasses.fields(message):
        assert getattr(back, field.name) == getattr(message, field.name)


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown message kind 'bogus'"):
        from_wire({"kind": "bogus"})


def test_unknown_status_is_refused():
    with pytest.raises(ValueError, match="status must be one of"):
        CaseFinished(case_id=1, rank=0, status="great")


def r(rank, status, order=0, text="", **kw):
    return RankResult(rank=rank, status=status, order=order, text=text, **kw)


def test_all_passed_returns_values_by_rank():
    verdict = judge([r(1, "passed", 0, value="b"), r(0, "passed", 1, value="a")], world_size=2)
    assert (verdict.outcome, verdict.values) == ("passed", ["a", "b"])


def test_earliest_failure_is_the_root_cause():
    results = [r(0, "failed", 1, "[rank 0] KeyError: 'a'"), r(1, "failed", 0, "[rank 1] ValueError: b")]
    verdict = judge(results, world_size=2)
    assert verdict.outcome == "failed"
    assert verdict.summary == "2 of 2 ranks did not pass; root cause: rank 1 failed: ValueError: b"


def test_a_failed_rank_is_named_by_the_headline_it_sent_not_its_texts_last_line():
    text = (
        "[rank 1] Traceback (most recent call last):\n[rank 1] ValueError: first line\n[rank 1] second line"
    )
    verdict = judge(
        [r(0, "passed"), r(1, "failed", text=text, headline="ValueError: first line")], world_size=2
    )
    assert verdict.summary == "1 of 2 ranks did not pass; root cause: rank 1 failed: ValueError: first line"


def test_a_symptom_is_recognised_by_its_headline_when_its_message_spans_lines():
    """A c10d error's first line says the peer is gone; C++ stack frames follow it."""
    symptom = r(
        0, "failed", 0, "[rank 0] frame #0: c10::Error", headline="RuntimeError: Connection closed by peer"
    )
    cause = r(1, "failed", 1, "[rank 1] KeyError: 'a'", headline="KeyError: 'a'")
    assert "root cause: rank 1 failed: KeyError: 'a'" in judge([symptom, cause], world_size=2).summary


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (
            NotImplementedError("Could not run 'aten::eq'\n\nCPU: registered at x"),
            "NotImplementedError: Could not run 'aten::eq'",
        ),
        (ValueError("\n  indented after a blank line\nmore"), "ValueError: indented after a blank line"),
        (AssertionError(), "AssertionError"),
        (SystemExit(1), "SystemExit: 1"),
        (KeyError("k"), "KeyError: 'k'"),
        (harness.RankFailure("one\ntwo"), "harness.outcome.RankFailure: one"),
    ],
    ids=["multi-line", "leading-blank-line", "no-message", "sys-exit", "key-error", "qualified-type"],
)
def test_the_headline_is_the_exception_type_and_the_first_line_of_its_message(exc, expected):
    assert headline(exc) == expected


def test_the_headline_of_a_chained_traceback_text_is_its_last_exceptions_first_line():
    text = "\n".join(
        f"[rank 0] {line}"
        for line in (
            "Traceback (most recent call last):",
            '  File "a.py", line 1, in f',
            "KeyError: 'x'",
            "",
            "During handling of the above exception, another exception occurred:",
            "",
            "Traceback (most recent call last):",
            '  File "a.py", line 3, in f',
            "ValueError: first line",
            "second line",
        )
    )
    assert headline_of_text(text) == "[rank 0] ValueError: first line"
    assert headline_of_text("[rank 0] no traceback here\n[rank 0] last") == "[rank 0] last"


def test_peer_symptom_ranks_after_the_real_cause():
    results = [
        r(0, "failed", 0, "[rank 0] RuntimeError: Timed out waiting 1500ms for recv"),
        r(1, "timeout", 1, "[rank 1] stacks"),
    ]
    assert "root cause: rank 1 did not finish before the deadline" in judge(results, world_size=2).summary


def test_a_passing_rank_never_hides_a_dead_one():
    verdict = judge([r(0, "passed"), r(1, "died", exitcode=-9)], world_size=2)
    assert verdict.outcome == "failed"
    assert "rank 1 died with signal SIGKILL (-9)" in verdict.summary
    assert "ranks that passed: [0]" in verdict.message


def test_asymmetric_skip_fails_and_uniform_skip_skips():
    assert judge([r(0, "passed"), r(1, "skipped", text="why")], world_size=2).outcome == "failed"
    verdict = judge([r(0, "skipped", text="why"), r(1, "skipped", text="why")], world_size=2)
    assert (verdict.outcome, verdict.message) == ("skipped", "why")


def test_describe_exit():
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(-11) == "signal SIGSEGV (-11)"
    assert describe_exit(None).startswith("no exit code")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"world_size": 0}, "world_size must be an int >= 1, got 0"),
        ({"world_size": 2.0}, "world_size must be an int >= 1, got 2.0"),
        ({"world_size": 2, "backend": "mpi"}, "backend must be one of ('gloo', 'nccl'), got 'mpi'"),
        ({"world_size": 2, "deadline_s": 0}, "deadline must be > 0 seconds, got 0"),
        ({"world_size": 2, "deadline_s": 5, "collective_timeout_s": 5}, "must be shorter than the deadline"),
    ],
)
def test_bad_config_is_a_value_error_naming_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DistConfig(**kwargs)


def test_marker_expansion_and_errors():
    assert [c.id for c in expand((2, 4), ("gloo", "nccl"))] == ["gloo-2", "gloo-4", "nccl-2", "nccl-4"]
    assert [c.id for c in from_marker((4,), {})] == ["gloo-4"]
    with pytest.raises(ValueError, match="unknown distributed marker arguments \\['worldsize'\\]"):
        from_marker((), {"worldsize": 2})
    with pytest.raises(ValueError, match="world_size must not be empty"):
        expand(())
    with pytest.raises(ValueError, match="backend must be one of"):
        harness.distributed(world_size=2, backend="cuda")


def test_current_outside_a_rank_says_how_to_get_one():
    with pytest.raises(RuntimeError, match="only available inside a rank"):
        harness.current()


def test_subtests_outside_ranks_run_every_config_and_name_failures():
    seen = []

    def body(x):
        seen.append(x)
        assert x != 2, "two is bad"

    with pytest.raises(harness.SubtestFailures) as info:
        harness.run_subtests([{"x": 1}, {"x": 2}, {"x": 3}], body)
    assert seen == [1, 2, 3]
    assert "1 of 3 subtests failed" in str(info.value)
    assert "subtest 1 (x=2) failed" in str(info.value)


def test_rank_fixture_outside_distributed_test_is_an_error(tmp_path):
    (tmp_path / "test_plain.py").write_text("def test_x(rank):\n    pass\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_plain.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "the 'rank' fixture only exists in tests marked @harness.distributed" in proc.stdout
    assert "1 error" in proc.stdout
