"""ShardedOptimizer on 1, 2 and 4 gloo ranks: DTensor/ShardedTensor shards, round trips, resharding
through torch.distributed.checkpoint, and training with ShardedGradScaler and forced infs.

Rank runs are few: each module-scoped fixture runs one rank body (``optimizer_ranks.py``) once, on
the harness's warm ranks (``module_ranks``), doing every optimizer at once, and the tests below
read one behaviour each from its result. Every sharded run is compared with the unsharded reference
(``optimizer_ranks.reference_run``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.tensor import Partial

from harness.frontends.plugin import Ranks
from suites.scaler import optimizer_ranks as bodies

SAVED_STEPS = 3
MORE_STEPS = 2
INF_STEP = 1
SCALER_STEPS = 4


def assert_same_tensors(
    actual: dict[str, Any], expected: dict[str, Any], what: str, *, exact: bool = False
) -> None:
    """Names first, then values: bit for bit when ``exact``, else to float32 tolerance (sharded
    runs against the unsharded reference, whose vectorised kernels may round differently)."""
    assert sorted(actual) == sorted(expected), f"{what}: names differ"
    tolerance = {"rtol": 0.0, "atol": 0.0} if exact else {}
    for name, value in expected.items():
        if isinstance(value, dict):
            assert_same_tensors(actual[name], value, f"{what}.{name}", exact=exact)
        else:
            torch.testing.assert_close(
                actual[name], value, **tolerance, msg=lambda m, n=name: f"{what}.{n}: {m}"
            )


# -- how a DTensor gradient reaches the local optimizer (2 ranks) -----------------------------


@pytest.fixture(scope="module")
def grad_links(module_ranks: Ranks) -> list[dict[str, Any]]:
    return module_ranks.run(bodies.rank_dtensor_grad_links, world_size=2)


def test_local_shard_grad_is_the_dtensor_grads_local_tensor(grad_links: list[dict[str, Any]]) -> None:
    assert [facts["local_grad_is_dtensor_grad_shard"] for facts in grad_links] == [True, True]


def test_in_place_unscale_of_the_local_grad_reaches_the_dtensor_grad(
    grad_links: list[dict[str, Any]],
) -> None:
    assert [facts["in_place_unscale_reaches_dtensor_grad"] for facts in grad_links] == [True, True]


def test_zero_grad_without_set_to_none_zeroes_dtensor_grads(grad_links: list[dict[str, Any]]) -> None:
    assert [facts["zero_grad_keeps_zeros"] for facts in grad_links] == [True, True]


def test_zero_grad_sets_dtensor_and_local_grads_to_none(grad_links: list[dict[str, Any]]) -> None:
    assert [facts["zero_grad_sets_none"] for facts in grad_links] == [True, True]


def test_step_uses_a_dtensor_grad_assigned_by_hand(grad_links: list[dict[str, Any]]) -> None:
    assert [facts["assigned_grad_used_by_step"] for facts in grad_links] == [True, True]


def test_partial_grad_of_a_replicated_parameter_is_reduced_before_the_step(
    grad_links: list[dict[str, Any]],
) -> None:
    assert [facts["partial_grad_reduced_before_step"] for facts in grad_links] == [True, True]


def test_added_group_of_sharded_parameters_is_stepped_and_saved_by_name(
    grad_links: list[dict[str, Any]],
) -> None:
    expected = (
        [["dense.weight", "dense.odd", "proj.bias"], ["table.weight", "scale"]],
        [0.1, 0.2],
        ["dense.odd", "dense.weight", "proj.bias", "scale", "table.weight"],
        "ShardedTensor",
    )
    assert [facts["added_group_saved_by_name"] for facts in grad_links] == [expected, expected]


# -- same world size: state_dict -> load_state_dict (2 ranks, no DCP) ----------------------------


@pytest.fixture(scope="module")
def round_trip(module_ranks: Ranks) -> dict[str, Any]:
    return module_ranks.run(bodies.rank_round_trip, SAVED_STEPS, MORE_STEPS, world_size=2)[0]


@pytest.mark.parametrize("opt_name", bodies.RESHARD_OPTIMIZERS)
def test_round_trip_restores_every_shards_state(round_trip: dict[str, Any], opt_name: str) -> None:
    states = round_trip[opt_name]["states"]
    assert_same_tensors(states["restored"], states["original"], f"{opt_name} state", exact=True)


@pytest.mark.parametrize("opt_name", bodies.RESHARD_OPTIMIZERS)
def test_round_trip_continues_like_uninterrupted_training(round_trip: dict[str, Any], opt_name: str) -> None:
    run = round_trip[opt_name]
    assert_same_tensors(run["restored"], run["original"], f"{opt_name} params", exact=True)


@pytest.mark.parametrize("opt_name", bodies.RESHARD_OPTIMIZERS)
def test_round_trip_state_matches_the_unsharded_run(round_trip: dict[str, Any], opt_name: str) -> None:
    reference = bodies.reference_run(opt_name, SAVED_STEPS)
    assert_same_tensors(round_trip[opt_name]["states"]["original"], reference["state"], f"{opt_name} state")


@pytest.fixture(scope="module")
def full_state_loaded(module_ranks: Ranks) -> dict[str, Any]:
    return module_ranks.run(bodies.rank_load_full_state, SAVED_STEPS, world_size=2)[0]


@pytest.mark.parametrize("opt_name", bodies.RESHARD_OPTIMIZERS)
def test_full_unsharded_state_loads_into_every_ranks_shards(
    full_state_loaded: dict[str, Any], opt_name: str
) -> None:
    reference = bodies.reference_run(opt_name, SAVED_STEPS)
    assert_same_tensors(full_state_loaded[opt_name], reference["state"], f"{opt_name} state")


# -- resharding through torch.distributed.checkpoint ---------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(module_ranks: Ranks, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """DCP checkpoints of model and optimizer after SAVED_STEPS steps, saved by 2 and by 4 ranks."""
    saved: dict[int, Path] = {}
    for world_size in (2, 4):
        root = tmp_path_factory.mktemp(f"saved_by_{world_size}_ranks")
        module_ranks.run(bodies.rank_train_and_save, str(root), SAVED_STEPS, world_size=world_size)
        saved[world_size] = root
    return saved


RESHARDINGS = [(2, 2), (2, 1), (2, 4), (4, 2)]


@pytest.fixture(scope="module", params=RESHARDINGS, ids=[f"{a}to{b}" for a, b in RESHARDINGS])
def resharded(
    request: pytest.FixtureRequest, module_ranks: Ranks, checkpoints: dict[int, Path]
) -> dict[str, Any]:
    saved_by, loaded_by = request.param
    root = str(checkpoints[saved_by])
    return module_ranks.run(
        bodies.rank_load_and_continue, root, SAVED_STEPS, MORE_STEPS, world_size=loaded_by
    )[0]


@pytest.mark.parametrize("opt_name", bodies.RESHARD_OPTIMIZERS)
def test_loaded_state_equals_the_unsharded_state_at_the_checkpoint(
    resharded: dict[str, Any], opt_name: str
) -> None:
    reference = bodies.reference_run(opt_name, SAVED_STEPS)
    assert_same_tensors(resharded[opt_name]["loaded_state"], reference["state"], f"{opt_name} state")


@pytest.mark.parametrize("opt_name", bodies.RESHARD_OPTIMIZERS)
def test_training_after_loading_matches_the_unsharded_run(resharded: dict[str, Any], opt_name: str) -> None:
    reference = bodies.reference_run(opt_name, SAVED_STEPS + MORE_STEPS)
    assert_same_tensors(resharded[opt_name]["params"], reference["params"], f"{opt_name} params")


# -- ShardedGradScaler with an inf on one rank (2 ranks) -----------------------------------------


@pytest.fixture(scope="module")
def scaled_training(module_ranks: Ranks) -> list[dict[str, Any]]:
    return module_ranks.run(bodies.rank_train_with_scaler, SCALER_STEPS, INF_STEP, world_size=2)


SCALER_OPTIMIZERS = list(bodies.OPTIMIZERS)


@pytest.mark.parametrize("opt_name", SCALER_OPTIMIZERS)
def test_every_rank_skips_the_step_where_one_rank_overflowed(
    scaled_training: list[dict[str, Any]], opt_name: str
) -> None:
    expected = [step == INF_STEP for step in range(SCALER_STEPS)]
    assert [per_rank[opt_name]["skipped"] for per_rank in scaled_training] == [expected, expected]


@pytest.mark.parametrize("opt_name", SCALER_OPTIMIZERS)
def test_skipped_step_leaves_parameters_and_optimizer_state_untouched(
    scaled_training: list[dict[str, Any]], opt_name: str
) -> None:
    assert [per_rank[opt_name]["untouched"][INF_STEP] for per_rank in scaled_training] == [True, True]


@pytest.mark.parametrize("opt_name", SCALER_OPTIMIZERS)
def test_scaled_training_matches_the_unsharded_run_without_the_skipped_step(
    scaled_training: list[dict[str, Any]], opt_name: str
) -> None:
    reference = bodies.reference_run(opt_name, SCALER_STEPS, skip=frozenset({INF_STEP}))
    for rank, per_rank in enumerate(scaled_training):
        assert_same_tensors(
            per_rank[opt_name]["params"], reference["params"], f"rank {rank} {opt_name} params"
        )


def test_fused_local_optimizer_is_driven_through_its_fused_scaling_path(
    scaled_training: list[dict[str, Any]],
) -> None:
    assert [per_rank["adam_fused"]["saw_grad_scale"] for per_rank in scaled_training] == [
        [True] * SCALER_STEPS
    ] * 2


def test_unfused_local_optimizer_gets_grads_unscaled_by_the_scaler(
    scaled_training: list[dict[str, Any]],
) -> None:
    non_skipped = SCALER_STEPS - 1
    assert [per_rank["adam"]["saw_grad_scale"] for per_rank in scaled_training] == [[False] * non_skipped] * 2


# -- bad input on a real process group (2 ranks) -------------------------------------------------


@pytest.fixture(scope="module")
def bad_loads(module_ranks: Ranks) -> dict[str, str]:
    return module_ranks.run(bodies.rank_bad_loads, world_size=2)[0]


def test_dtensor_state_refuses_to_load_into_a_plain_parameter(bad_loads: dict[str, str]) -> None:
    assert bad_loads["dtensor_state_into_plain"] == (
        "ValueError: parameter 'dense.weight': saved optimizer state 'exp_avg' is a DTensor, which loads "
        "directly only into a DTensor parameter on the same device mesh, not into a plain tensor; to load at "
        "another world size or sharding, load the checkpoint with torch.distributed.checkpoint"
    )


def test_sharded_state_of_another_global_shape_is_refused_naming_the_parameter(
    bad_loads: dict[str, str],
) -> None:
    assert bad_loads["global_shape"] == (
        "ValueError: parameter 'dense.weight': saved optimizer state 'exp_avg' has shape (8, 4), but the "
        "parameter has shape (10, 4); the checkpoint belongs to another model"
    )


def test_full_state_of_another_shape_is_refused_naming_the_parameter(bad_loads: dict[str, str]) -> None:
    assert bad_loads["full_state_shape"] == (
        "ValueError: parameter 'dense.weight': saved optimizer state 'exp_avg' has shape (3, 4), but the "
        "parameter has shape (8, 4); the checkpoint belongs to another model"
    )


def test_partial_dtensor_parameter_is_refused_naming_it(bad_loads: dict[str, str]) -> None:
    placement = str(Partial())  # "P(sum)"; torch < 2.7 prints "P"
    assert bad_loads["partial_param"] == (
        f"ValueError: parameter 'p' has placement {placement}; ShardedOptimizer supports DTensor parameters "
        "placed with Shard(dim) and Replicate() only"
    )
