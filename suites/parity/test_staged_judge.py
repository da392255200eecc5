"""The staged check's verdict from what the ranks sent (``judge/staged.py``; pure, no ranks): each
stage that does not hold fails the row and is named, where it is and on which rank; which rows
the runner sends to it at all.

Why pure: the rank side is exercised at world size 4 in ``test_staged.py`` and
``test_world_size.py``; here each stage's rule is checked alone, with records made by hand.
"""

from __future__ import annotations

import dataclasses

import pytest

from harness.parity.judge import staged
from harness.parity.plan.config import Layout, Loop, Mesh, ParityConfig, Resume
from harness.parity.ranks.wire import Bounded, Compared, StagedRun, StagedStep

_FSDP2 = ParityConfig(
    engine="fsdp2", optimizer="sgd", world_size=4, steps=1, layout=Layout(reshard_after_forward=True)
)


def _compared(elements: int, differing: int, max_ulp: float) -> Compared:
    return Compared(elements=elements, differing=differing, max_ulp=max_ulp)


def _step(**changes: object) -> StagedStep:
    found = StagedStep(
        loss=(1.5, 1.5),
        local={"w": _compared(8, 0, 0.0)},
        poisoned=False,
        reduction={"w": Bounded(elements=8, violations=0, worst_ratio=0.4)},
        reordered=3,
        scale=(65536.0, 65536.0),
        tracker=(1, 1),
        update={"param:w": _compared(8, 0, 0.0)},
    )
    return dataclasses.replace(found, **changes)


def _run(*steps: StagedStep, error: str | None = None) -> StagedRun:
    return StagedRun(id="row", rank=0, steps=steps, error=error, duration_s=0.0)


def _parts(*steps: StagedStep, world: int = 4) -> list[StagedRun]:
    return [dataclasses.replace(_run(*steps), rank=rank) for rank in range(world)]


def test_every_stage_holding_passes_and_says_what_it_measured():
    found = staged.judge(_FSDP2, _parts(_step()))
    assert found.passed and found.local_elements == 32 and found.reduced_elements == 8
    assert found.reordered == 3 and found.worst_ratio == pytest.approx(0.4)
    assert "staged check passed over 1 steps" in found.summary()


@pytest.mark.parametrize(
    ("changes", "stage"),
    [
        ({"loss": (1.5, 1.25)}, "loss"),
        ({"local": {"w": _compared(8, 1, 3.0)}}, "local"),
        ({"reduction": {"w": Bounded(elements=8, violations=2, worst_ratio=7.5)}}, "reduction"),
        ({"reduction_names": (("w",), ())}, "reduction"),
        ({"update": {"param:w": _compared(8, 1, 1.0)}}, "update"),
        ({"scale": (65536.0, 32768.0)}, "scale"),
        ({"clip": (0.5, 0.25)}, "clip"),
        ({"buffers": {"bn.running_mean": _compared(4, 1, 2.0)}}, "buffer"),
    ],
    ids=["loss", "local", "reduction", "reduced_by_one_side", "update", "scale", "clip_norm", "buffer"],
)
def test_a_stage_that_does_not_hold_fails_the_row_and_is_named(changes, stage):
    found = staged.judge(_FSDP2, _parts(_step(**changes)))
    assert not found.passed
    assert found.findings[0].stage == stage, found.findings
    assert found.summary().startswith("staged check failed: step 0, " + stage)


@pytest.mark.parametrize("scalar", ["scale", "tracker"])
def test_each_scalar_of_the_scalers_state_is_compared_on_its_own(scalar):
    """The scale stage compares every scalar the ranks record of the scaler's state, each alone:
    a growth tracker that moved otherwise under the same scale is a scaler that will grow its
    scale on another step, and fails the row naming that scalar."""
    differs = {"scale": [65536.0, 32768.0], "tracker": [1, 0]}[scalar]
    found = staged.judge(_FSDP2, _parts(_step(**{scalar: differs})))
    assert not found.passed
    assert [(f.stage, f.what) for f in found.findings] == [("scale", scalar)]


def test_a_fused_optimizers_update_is_held_to_equal_bits_like_any_other():
    """Its reference steps the candidate's shards (``sides/optim/step_pieces.py``), so one element one
    ulp apart after the step is a finding, as for any optimizer: no fallback tolerance is left."""
    fused = ParityConfig(
        engine="fsdp2",
        optimizer="adam_fused",
        world_size=4,
        steps=1,
        layout=Layout(reshard_after_forward=True),
    )
    one_ulp = staged.judge(fused, _parts(_step(update={"param:w": _compared(8, 1, 1.0)})))
    assert not one_ulp.passed
    assert [(f.stage, f.what) for f in one_ulp.findings] == [("update", "param:w")]
    assert "held to bitwise" in one_ulp.findings[0].detail


def test_the_rank_that_differs_is_named():
    parts = _parts(_step())
    parts[2] = dataclasses.replace(_run(_step(local={"w": _compared(8, 2, 1.0)})), rank=2)
    found = staged.judge(_FSDP2, parts)
    assert found.findings[0].rank == 2 and "on rank 2" in found.findings[0].line()


def test_a_rank_that_raised_leaves_the_check_unrun_with_its_error():
    parts = _parts(_step())
    parts[1] = dataclasses.replace(_run(error="[rank 1] RuntimeError: boom"), rank=1)
    found = staged.judge(_FSDP2, parts)
    assert not found.passed and found.error.startswith("[rank 1]")
    assert "could not run" in found.summary()


@pytest.mark.parametrize(
    ("config", "status", "max_ulp", "sent"),
    [
        (_FSDP2, "pass", 0.0, False),  # bitwise: nothing to decide
        (_FSDP2, "pass", 3.0, True),
        (_FSDP2, "fail", 9.0, True),
        (_FSDP2, "crash", 0.0, False),
        (ParityConfig(engine="ddp", optimizer="sgd", world_size=4, steps=1), "fail", 9.0, False),  # DDP
        (
            ParityConfig(
                engine="fsdp2",
                optimizer="sgd",
                world_size=4,
                layout=Layout(reshard_after_forward=True),
                loop=Loop(accumulate=2, sync="every"),
            ),
            "fail",
            9.0,
            True,
        ),
        (
            ParityConfig(
                engine="fsdp2",
                optimizer="sgd",
                world_size=4,
                layout=Layout(reshard_after_forward=True),
                loop=Loop(accumulate=2, sync="last"),
            ),
            "fail",
            9.0,
            True,
        ),
        (
            ParityConfig(
                engine="fsdp1",
                optimizer="sgd",
                world_size=4,
                layout=Layout(sharding="full_shard", use_orig_params=False),
            ),
            "fail",
            9.0,
            True,
        ),
        (
            ParityConfig(
                engine="fsdp2",
                optimizer="adam_fused",
                world_size=4,
                steps=1,
                layout=Layout(reshard_after_forward=True),
            ),
            "pass",
            3.0,
            True,
        ),
        (
            ParityConfig(
                engine="fsdp2",
                optimizer="sgd",
                world_size=4,
                layout=Layout(reshard_after_forward=True),
                loop=Loop(path="unscale_clip", clip=0.05),
            ),
            "fail",
            9.0,
            True,
        ),
        (
            ParityConfig(
                engine="fsdp2",
                workload="llama",
                world_size=4,
                layout=Layout(reshard_after_forward=True),
                mesh=Mesh(hsdp=2),
            ),
            "fail",
            9.0,
            True,
        ),
        (
            ParityConfig(
                engine="fsdp2",
                workload="llama",
                world_size=4,
                layout=Layout(reshard_after_forward=True),
                mesh=Mesh(tp=2),
            ),
            "fail",
            9.0,
            False,
        ),
        (
            ParityConfig(
                engine="fsdp2",
                optimizer="sgd",
                world_size=4,
                layout=Layout(reshard_after_forward=True),
                resume=Resume(at=2, method="dcp"),
            ),
            "fail",
            9.0,
            False,
        ),
    ],
    ids=[
        "bitwise",
        "close",
        "failed",
        "crashed",
        "ddp",
        "accumulate_every",
        "accumulate_last",
        "fsdp1",
        "fused",
        "clip",
        "hsdp",
        "tp",
        "resume",
    ],
)
def test_which_rows_the_runner_sends_to_the_staged_check(config, status, max_ulp, sent):
    """Every kind of row the check tells apart, each alone: FSDP1 and FSDP2, fused and not,
    accumulating either way, clipping, HSDP are sent; a TP row (its local gradients are TP shards of
    another layout, its twin mirrors the split) and a resume row (the check trains without the
    restart, so a lost state would pass) are not, nor DDP's (its reducer runs in C++). A sparse
    row is DDP against ``reference="single"`` by construction (``ParityConfig`` refuses any other
    engine), so the ``ddp`` case covers it."""
    assert staged.wanted(config, status, max_ulp, expected_failure="") is sent


def test_a_row_expected_to_fail_keeps_its_straight_verdict():
    assert not staged.wanted(_FSDP2, "fail", 9.0, expected_failure="torch's scaler ...")


def test_a_pass_the_staged_check_could_not_establish_becomes_an_error_naming_why():
    from harness.parity.doors import runner
    from harness.parity.judge.result import ParityResult

    straight = ParityResult(config=_FSDP2, status="pass", profile="fp32", max_ulp=3.0)
    broken = staged.Staged(passed=False, error="[rank 1] KeyError: 'w'")
    decided = runner._with_staged(straight, broken)
    assert decided.status == "error" and "could not run" in decided.reason
    assert decided.detail == "[rank 1] KeyError: 'w'"
    failed = ParityResult(config=_FSDP2, status="fail", profile="exact", max_ulp=3.0, reason="step 0 ...")
    assert runner._with_staged(failed, broken).status == "fail"
