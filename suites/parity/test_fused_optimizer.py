"""A fused optimizer is judged as any other: ``exact``, and bitwise, under FSDP1 and FSDP2.

Why: ``Adam(fused=True)``'s CPU kernel rounds an element by its offset in the tensor it is given
(the vector body or the scalar tail of the tensor), and FSDP gives it each rank's shard where an
unsharded reference gave it whole parameters: a few elements a step came out one ulp apart, and
fused rows were held to the ``fp32`` fallback. The reference now steps the candidate's shards as
tensors of their own (``harness/parity/ranks/sides/optim/step_pieces.py``), so the rows below must be
bitwise from the first step. The ``uneven`` workload's rows split 11 + 10 and 22 + 21, so the
shards' tails fall elsewhere than the whole parameters' (a reference stepping whole tensors again
fails these rows: ``ci/mutation``, on any CPU whose vectors round otherwise than its scalars,
AVX2 and AVX-512 among them; under ``ATEN_CPU_CAPABILITY=default`` the two paths agree anyway).
"""

from __future__ import annotations

from harness.parity.plan import profiles
from harness.parity.plan.config import ParityConfig
from suites.parity.support import describe

_COMMON = {"workload": "uneven", "optimizer": "adam_fused", "world_size": 2}

CONFIGS = [
    ParityConfig.from_flat(engine="fsdp1", sharding="full_shard", use_orig_params=False, **_COMMON),
    ParityConfig.from_flat(engine="fsdp1", sharding="full_shard", use_orig_params=True, **_COMMON),
    ParityConfig.from_flat(engine="fsdp2", reshard_after_forward=True, **_COMMON),
]


def test_a_fused_adam_row_is_judged_with_the_exact_profile(parity_config):
    assert profiles.profile_for(parity_config) is profiles.EXACT


def test_a_fused_adam_row_passes_bitwise_straight_through(parity_config, outcome):
    """Every step, every parameter and every element of the optimizer's state equal to the
    reference's, without the staged check's help."""
    result = outcome.result
    assert result.status == "pass", describe(outcome)
    assert result.profile == "exact"
    assert result.closeness == "bitwise" and result.max_ulp == 0, (result.closeness, result.worst)
    assert result.staged is None
