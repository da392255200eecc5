"""The clip norm of path ``unscale_clip``: recorded by every rank, compared with the reference's every
step under a measured tolerance, and a rank that clipped with its own shard's norm named
(``clip_norm_sharded``), from hand-made records and planted into a real FSDP1 candidate."""

import math

import pytest

from fixtures.parity_plants import Plant, planted_executor
from fixtures.parity_records import next_float, replace_step, run, step
from harness.parity.doors import runner
from harness.parity.judge import causes, clip_norm
from harness.parity.judge.compare import compare_runs
from harness.parity.plan import profiles
from harness.parity.plan.config import Layout, Loop, ParityConfig, Precision
from harness.parity.plan.matrices import default as matrix
from harness.parity.plan.matrices import workload as workload_matrix
from harness.parity.plan.matrices.declared import Declared
from suites.parity.support import cli_in_process, describe, ranks_executor

_NORM = 0.13837067782878876


def _clipped(*norms):
    return run(replace_step(step(0), clip_norms=tuple(norms)))


def _compare(reference, candidate, profile=profiles.EXACT):
    return compare_runs(reference, candidate, profile=profile)


def test_a_norm_a_few_ulps_from_the_references_passes_as_summation_order():
    assert _compare(_clipped(_NORM, _NORM), _clipped(_NORM, next_float(_NORM, 2))).ok


def test_a_norm_beyond_the_measured_ulps_fails_as_a_clip_norm_divergence():
    far = next_float(_NORM, clip_norm.ORDER_ULPS + 1)
    first = _compare(_clipped(_NORM, _NORM), _clipped(far, far)).first
    assert first is not None and first.what == "clip_norm"
    assert f"rank 1 {far!r}, reference {_NORM!r}" in first.message


def test_a_profile_wider_than_the_ulps_allows_its_rtol():
    near = _NORM * (1 + 1e-6)
    assert _compare(_clipped(_NORM, _NORM), _clipped(near, near), profiles.FP32).ok


def _clipped_over(elements, *norms):
    """A step whose norms sum ``elements`` squares (one gradient of that many elements)."""
    import torch

    grads = {"layer.weight": torch.zeros(elements)}
    return run(replace_step(step(0), clip_norms=tuple(norms), grads=grads))


def test_a_norm_of_many_squares_passes_within_what_any_summation_order_can_give():
    """Measured at world size 4 on a tiny Hugging Face Mixtral under FSDP1: 2.3e-6 apart."""
    near = _NORM * (1 + 2.3e-6)
    assert _compare(_clipped_over(200_000, _NORM, _NORM), _clipped_over(200_000, near, near)).ok
    assert not _compare(_clipped_over(10, _NORM, _NORM), _clipped_over(10, near, near)).ok


def test_a_norm_off_by_the_square_root_of_the_world_size_fails_whatever_the_elements():
    off = _NORM * math.sqrt(2)
    first = _compare(_clipped_over(1_000_000, _NORM, _NORM), _clipped_over(1_000_000, off, off)).first
    assert first is not None and first.what == "clip_norm"
    assert "what any order of summing 1000000 squares can give" in first.message


def test_the_order_free_bound_is_gamma_of_the_squares_and_their_roundings():
    unit = 2.0**-24
    assert clip_norm.order_free_bound(0) == pytest.approx(4 * unit / (1 - 4 * unit) + 2 * unit)
    terms = 10**6 + 4
    assert clip_norm.order_free_bound(10**6) == pytest.approx(terms * unit / (1 - terms * unit) + 2 * unit)


def test_infinite_norms_on_both_sides_agree_and_a_finite_one_against_inf_does_not():
    assert _compare(_clipped(math.inf, math.inf), _clipped(math.inf, math.nan)).ok
    assert not _compare(_clipped(math.inf, math.inf), _clipped(_NORM, math.inf)).ok


def test_a_candidate_that_clips_where_the_reference_does_not_fails():
    first = _compare(run(step(0)), _clipped(_NORM, _NORM)).first
    assert first is not None and first.what == "clip_norm" and "the candidate clipped" in first.message


def test_partial_norms_whose_squares_add_up_to_the_references_are_named_clip_norm_sharded():
    reference, candidate = _clipped(_NORM, _NORM), _clipped(_NORM * 0.6, _NORM * 0.8)
    found = {c.name: c for c in causes.match(reference, candidate, _compare(reference, candidate))}
    cause = found["clip_norm_sharded"]
    assert "the square root of the sum of their squares is 0.138371" in cause.evidence
    assert "its own gradient shard as if it were the total" in cause.explanation


def test_every_rank_off_by_the_same_norm_is_no_sharded_clip():
    reference, candidate = _clipped(_NORM, _NORM), _clipped(_NORM * 2, _NORM * 2)
    names = [c.name for c in causes.match(reference, candidate, _compare(reference, candidate))]
    assert "clip_norm_sharded" not in names


_FSDP1 = ParityConfig(
    engine="fsdp1",
    layout=Layout(sharding="full_shard", use_orig_params=False),
    loop=Loop(path="unscale_clip"),
)
_FSDP2 = ParityConfig(
    engine="fsdp2",
    layout=Layout(reshard_after_forward=True),
    precision=Precision(dtype="bf16"),
    loop=Loop(path="unscale_clip"),
)


@pytest.fixture(scope="module")
def clipped(module_ranks):
    """``{id: Outcome}`` of FSDP1 and FSDP2 rows clipping at 1.0 (never bites on the MLP) and 0.05."""
    rows = [_FSDP1, _FSDP2, _FSDP1.with_(clip=0.05), _FSDP2.with_(clip=0.05)]
    return {o.result.config.id: o for o in runner.run(rows, ranks_executor(module_ranks))}


def test_every_rank_records_the_norm_its_clip_returned_every_step(clipped):
    outcome = clipped[_FSDP1.id]
    assert all(len(s.clip_norms) == 2 and s.clip_norms[0] > 0 for s in outcome.candidate.steps)
    assert all(len(s.clip_norms) == 2 for s in outcome.reference.steps)


@pytest.mark.parametrize(
    "config", [_FSDP1, _FSDP2, _FSDP1.with_(clip=0.05), _FSDP2.with_(clip=0.05)], ids=lambda c: c.id
)
def test_fsdp_clipping_after_unscale_passes_against_ddp(clipped, config):
    outcome = clipped[config.id]
    assert outcome.passed, describe(outcome)


def test_a_configured_max_norm_is_named_in_the_id_and_the_default_is_not():
    assert _FSDP1.with_(clip=0.05).id == "fsdp1-full_shard-flat-fp32-sgd-unscale_clip-clip0.05-w2"
    assert "clip" not in _FSDP1.id.removesuffix("unscale_clip-w2")


def test_a_max_norm_off_the_clipping_path_is_refused():
    with pytest.raises(ValueError, match="clips on path='unscale_clip' only"):
        ParityConfig(engine="fsdp2", layout=Layout(reshard_after_forward=True), loop=Loop(clip=0.5))


def test_rows_clipping_at_other_norms_have_references_of_their_own():
    assert _FSDP1.reference_key() != _FSDP1.with_(clip=0.05).reference_key()


@pytest.fixture(scope="module")
def local_clip(module_ranks):
    """FSDP1 clipping with each rank's partial norm (the ``local_clip`` plant)."""

    executor = planted_executor(module_ranks, Plant(kind="local_clip"))
    (outcome,) = runner.run([_FSDP1], executor, localize=False)
    return outcome


def test_each_ranks_partial_norm_used_as_the_total_fails_at_the_clip_norm(local_clip):
    result = local_clip.result
    assert result.status == "fail" and result.first_diverging_step == 0
    assert "clip norm rank 0" in describe(local_clip)


def test_each_ranks_partial_norm_used_as_the_total_is_named_clip_norm_sharded(local_clip):
    assert [c.name for c in local_clip.result.causes][:1] == ["clip_norm_sharded"]


def test_an_fsdp_clip_is_held_to_fp32_as_its_norm_sums_in_another_order_and_ddps_stays_exact():
    assert profiles.profile_for(_FSDP1).name == "fp32"
    assert profiles.profile_for(ParityConfig(engine="ddp", loop=Loop(path="unscale_clip"))).name == "exact"


def test_the_default_matrix_clips_for_real_under_fsdp1_and_fsdp2():
    rows = [c for c in matrix.default_matrix() if c.loop.clip != 1.0]
    assert {c.engine for c in rows} == {"fsdp1", "fsdp2"} and all(c.loop.path == "unscale_clip" for c in rows)


def test_a_workloads_matrix_runs_the_users_max_norm_under_every_layout():
    rows = [
        c
        for c in workload_matrix.for_workload("mlp", declared=Declared(clip=0.5))
        if c.loop.path == "unscale_clip"
    ]
    assert {c.loop.clip for c in rows} == {0.5} and len(rows) == 12 * 2


def test_the_optimizer_receives_gradients_clipped_to_the_configured_max_norm(clipped):
    outcome = clipped[_FSDP1.with_(clip=0.05).id]
    for run_ in (outcome.reference, outcome.candidate):
        assert all(s.grad_norm <= 0.05 * (1 + 1e-5) for s in run_.steps), [s.grad_norm for s in run_.steps]


def _cli(*args):
    return cli_in_process(*args)


def test_clip_without_a_workload_exits_2_naming_the_k_filter():
    done = _cli("--clip", "0.5", "--list")
    assert done.returncode == 2 and "-k unscale_clip" in done.stderr


def test_the_cli_lists_the_users_max_norm_under_every_layout():
    done = _cli("--workload", "mlp", "--clip", "0.5", "--list", "-k", "clip0.5")
    assert done.returncode == 0, done.stderr
    assert (
        sum(line.split(" ")[0].endswith("-unscale_clip-clip0.5-w2") for line in done.stdout.splitlines())
        == 12 * 2
    )


@pytest.fixture(scope="module")
def misordered(module_ranks):
    """``{plant kind: Outcome}``: FSDP2 clipping still scaled, and unscaled twice."""
    found = {}
    for kind in ("clip_scaled", "clip_unscaled_twice"):
        executor = planted_executor(module_ranks, Plant(kind=kind))
        (found[kind],) = runner.run([_FSDP2], executor, localize=False)
    return found


@pytest.mark.parametrize(
    ("kind", "said"),
    [("clip_scaled", "clipped while still scaled"), ("clip_unscaled_twice", "unscaled once more")],
)
def test_a_clip_in_the_wrong_place_around_unscale_is_named_clip_unscale_order(misordered, kind, said):
    outcome = misordered[kind]
    assert outcome.result.status == "fail" and outcome.result.first_diverging_step == 0
    cause = next(c for c in outcome.result.causes if c.name == "clip_unscale_order")
    assert said in cause.evidence, describe(outcome)


def test_norms_a_factor_of_sqrt_two_apart_are_no_unscale_order():
    reference, candidate = _clipped(_NORM, _NORM), _clipped(_NORM * 2**0.5, _NORM * 2**0.5)
    names = [c.name for c in causes.match(reference, candidate, _compare(reference, candidate))]
    assert "clip_unscale_order" not in names
