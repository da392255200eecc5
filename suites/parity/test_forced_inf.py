"""Forced-inf step skipping: inf or NaN written into one gradient, on one rank only or on every rank
at once, at steps 2 and 6 (of 7, ``growth_interval=3``), for DDP, FSDP1 and FSDP2, on the plain
path, with a fused optimizer, with ``unscale_`` then ``clip_grad_norm_``, and with two optimizers
(the poisoned gradient belongs to the first).
"""

import pytest
import torch

from harness.parity.plan.matrices import default as matrix
from suites.parity.support import describe

KEEP_TENSORS = True  # the tests read every step's parameters and gradients
CONFIGS = matrix.forced_inf(world_size=2)


def _poisoned(config):
    return sorted({fault.step for fault in config.faults})


def test_every_rank_skips_the_poisoned_optimizer_step(parity_config, outcome):
    for step in _poisoned(parity_config):
        record = outcome.candidate.steps[step]
        decided = [flags[0] for flags in record.skipped if flags[0] is not None]
        assert decided and all(decided), f"step {step}: skip decisions by rank {record.skipped}"


def test_a_second_optimizer_with_clean_gradients_still_steps(parity_config, outcome):
    if parity_config.loop.path != "two_optimizers":
        pytest.skip("one optimizer")
    for step in _poisoned(parity_config):
        record = outcome.candidate.steps[step]
        assert all(flags[1] is False for flags in record.skipped), f"step {step}: {record.skipped}"


def test_parameters_and_optimizer_state_stay_bitwise_unchanged(parity_config, outcome):
    steps = outcome.candidate.steps
    for step in _poisoned(parity_config):
        before, after = steps[step - 1], steps[step]
        names = [
            n for n in after.params if parity_config.loop.path != "two_optimizers" or n.startswith("inp.")
        ]
        for name in names:
            assert torch.equal(before.params[name], after.params[name]), f"step {step}: {name} changed"
            for key, value in after.optim_state.get(name, {}).items():
                assert torch.equal(before.optim_state[name][key], value), f"step {step}: {name}:{key} changed"


def test_the_scale_backs_off_equally_on_every_rank(parity_config, outcome):
    steps = outcome.candidate.steps
    for step in _poisoned(parity_config):
        previous = steps[step - 1].scales[0]
        assert steps[step].scales == (previous / 2,) * parity_config.world_size, f"step {step}"
        assert steps[step].trackers == (0,) * parity_config.world_size, f"step {step}"


def test_growth_resumes_after_growth_interval_clean_steps(parity_config, outcome):
    """After the backoff at step 2: trackers 1, 2 at steps 3, 4; at step 5 the scale doubles."""
    steps = outcome.candidate.steps
    world = parity_config.world_size
    backed_off = steps[2].scales[0]
    assert [steps[s].trackers for s in (3, 4, 5)] == [(1,) * world, (2,) * world, (0,) * world]
    assert [steps[s].scales for s in (3, 4, 5)] == [(backed_off,) * world] * 2 + [(backed_off * 2,) * world]


def test_counters_agree_on_every_rank(parity_config, outcome):
    if parity_config.scale.scaler != "ours":
        pytest.skip("torch's ShardedGradScaler keeps no counters")
    optimizers = 2 if parity_config.loop.path == "two_optimizers" else 1
    poisoned = len(_poisoned(parity_config))
    expected = {
        "steps": parity_config.steps * optimizers,
        "skipped_steps": poisoned,
        "growths": 1,
        "backoffs": poisoned,
    }
    assert list(outcome.candidate.counters) == [expected] * parity_config.world_size


def test_the_run_matches_the_reference_where_every_rank_was_poisoned(parity_config, outcome):
    """The reference (DDP with torch.amp.GradScaler) takes each fault on every rank: what every
    rank of the candidate must do when any rank overflows."""
    assert outcome.result.status == "pass", describe(outcome)
