"""Ours and torch's ShardedGradScaler on the same configurations: where torch's is correct both
pass; where it is not (a fused optimizer with an inf on one rank under DDP or FSDP1; ``unscale_``
then a fused step on FSDP2's DTensor gradients) torch's rows are expected failures and ours pass.
Under FSDP2 torch's fused path happens to agree: the unscale kernel on DTensor gradients all-reduces
found_inf inside DTensor dispatch.
"""

import pytest

from harness.parity.plan.config import SCALERS, Fault, Layout, Loop, ParityConfig, Scale
from suites.parity.support import describe, unaffected_by_expected_failures

SCALER_PINNED = True
_SHOWCASE = [
    ParityConfig(
        engine="fsdp1", optimizer="sgd", layout=Layout(sharding="full_shard", use_orig_params=False)
    ),
    ParityConfig(engine="fsdp2", optimizer="adam", layout=Layout(reshard_after_forward=True)),
    ParityConfig(
        suite="forced_inf",
        engine="fsdp1",
        optimizer="adam_fused",
        faults=(Fault(step=2, rank=1),),
        layout=Layout(sharding="full_shard", use_orig_params=False),
        scale=Scale(init_scale=1024.0),
    ),
    ParityConfig(
        suite="forced_inf",
        engine="fsdp2",
        optimizer="adam_fused",
        faults=(Fault(step=2, rank=1),),
        layout=Layout(reshard_after_forward=True),
        scale=Scale(init_scale=1024.0),
    ),
    ParityConfig(
        suite="forced_inf",
        engine="ddp",
        optimizer="adam_fused",
        faults=(Fault(step=2, rank=1),),
        scale=Scale(init_scale=1024.0),
    ),
    ParityConfig(
        engine="fsdp2",
        optimizer="adam_fused",
        layout=Layout(reshard_after_forward=True),
        loop=Loop(path="unscale_clip"),
    ),
]
CONFIGS = [config.with_(scaler=scaler) for config in _SHOWCASE for scaler in SCALERS]


def test_the_scaler_trains_like_the_reference(parity_config, outcome):
    assert outcome.result.status == "pass", describe(outcome)


@unaffected_by_expected_failures
def test_torchs_rows_fail_exactly_where_it_is_known_to_be_wrong(parity_config, outcome):
    result = outcome.result
    if parity_config.scale.scaler == "ours":
        pytest.skip("torch's rows only")
    assert result.broken == bool(result.expected_failure), describe(outcome)
    if "crashes" in result.expected_failure:
        assert result.status == "crash" and "doesn't match the broadcast shape" in outcome.candidate.error
    elif result.expected_failure:
        first = result.divergences[0]
        assert first.step == 2 and first.what == "agreement", describe(outcome)
