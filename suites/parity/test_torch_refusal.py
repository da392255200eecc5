"""A row the installed torch cannot run is refused naming the version, never an ERROR.

Why: the engine reads torch's internals through ``harness/torch_private``; where an adapter has no
branch for the installed torch it raises ``UnsupportedTorch``. The row must then say which torch
it met and which it needs (a skip, as a missing GPU is), not show an ``ImportError`` from deep in
a rank's traceback, which is what every FSDP2 row of torch 2.11 showed before the adapters."""

from __future__ import annotations

import traceback

import pytest

from fixtures.parity_records import run, step
from harness.failure_text import prefix_lines
from harness.parity.judge import result as results
from harness.parity.plan.config import Layout, ParityConfig
from harness.torch_private import UnsupportedTorch, at_least, release

_FSDP2 = ParityConfig(engine="fsdp2", layout=Layout(reshard_after_forward=True))


def _raised_on_rank(exc: BaseException, rank: int) -> str:
    """What a rank records for a run that raised ``exc`` (``train.Run``: the prefixed traceback)."""
    try:
        raise exc
    except BaseException:
        return prefix_lines(traceback.format_exc(), rank)


def test_a_run_an_adapter_refused_is_a_skip_naming_both_versions():
    refused = UnsupportedTorch("the composable replicate() twin", needs="2.12", installed="2.11.0")
    reference = run(step(0), error=_raised_on_rank(refused, 1))
    verdict, _, _ = results.verdict(_FSDP2, reference, None, gaps=[None], reused=False)
    assert verdict.status == "skip"
    assert verdict.reason == (
        "torch 2.11.0 cannot run the composable replicate() twin: it needs torch 2.12 or newer"
    )


def test_a_candidate_refused_after_its_reference_ran_is_a_skip_too():
    refused = UnsupportedTorch("a feature", needs="2.14", installed="2.13.0")
    candidate = run(step(0), role="candidate", error=_raised_on_rank(refused, 0))
    verdict, _, _ = results.verdict(_FSDP2, run(step(0)), candidate, gaps=[None], reused=False)
    assert (verdict.status, verdict.reason) == (
        "skip",
        "torch 2.13.0 cannot run a feature: it needs torch 2.14 or newer",
    )


def test_any_other_error_of_a_reference_stays_an_error():
    reference = run(step(0), error=_raised_on_rank(ImportError("cannot import name 'x' from 'torch.y'"), 1))
    verdict, _, _ = results.verdict(_FSDP2, reference, None, gaps=[None], reused=False)
    assert verdict.status == "error"
    assert "ImportError: cannot import name 'x'" in verdict.reason


@pytest.mark.parametrize(
    ("version", "expected"), [("2.11.0", (2, 11)), ("2.14.1+cu130", (2, 14)), ("2.13.0+cpu", (2, 13))]
)
def test_a_torch_version_reads_as_its_release(version, expected):
    assert release(version) == expected


def test_the_installed_torch_is_at_least_its_own_release():
    assert at_least(*release())
    assert not at_least(release()[0], release()[1] + 1)
