"""Engines gather full tensors even when the ranks disagree, the very case the engine exists to show:
a rank that skipped the first step has no optimizer state while its peer does."""

import pytest

import harness
from fixtures import candidate_steps
from harness.parity.plan.config import Layout, ParityConfig

CANDIDATES = [
    ParityConfig(engine="fsdp2", optimizer="adam", layout=Layout(reshard_after_forward=True)),
    ParityConfig(engine="fsdp2", optimizer="sgd", layout=Layout(reshard_after_forward=True)),
    # rows that do not divide by the world size: the zeros standing in for rank 1's missing state
    # must state the global shape (gather.zeros_like_shards), or the gather's sizes differ
    ParityConfig(
        engine="fsdp2", optimizer="adam", workload="uneven", layout=Layout(reshard_after_forward=True)
    ),
    ParityConfig(
        engine="fsdp1", optimizer="adam", layout=Layout(sharding="full_shard", use_orig_params=True)
    ),
    ParityConfig(
        engine="fsdp1", optimizer="sgd", layout=Layout(sharding="full_shard", use_orig_params=False)
    ),
]


def _gather_after_only_rank_0_stepped(config):
    engine, optimizer = candidate_steps.after_backward(config)
    if harness.current().rank == 0:
        optimizer.step()
    params, state = engine.full_after_step([optimizer])
    return sorted(params), {name: sorted(values) for name, values in state.items()}


@pytest.mark.parametrize("config", CANDIDATES, ids=lambda c: c.id)
def test_state_present_on_one_rank_only_is_gathered_without_a_collective_mismatch(ranks, config):
    (params, state), (params_1, state_1) = ranks.run(_gather_after_only_rank_0_stepped, config, world_size=2)
    assert params == params_1 and state == state_1
    # Parameters with elements on rank 0 have state (rank 0 stepped); those whose elements all lie
    # on rank 1 (which did not step) have none, as in the sharded optimizer itself.
    assert state and set(state) <= set(params)
    expected = ["exp_avg", "exp_avg_sq", "step"] if config.optimizer == "adam" else ["momentum_buffer"]
    assert all(keys == expected for keys in state.values())
