"""A model whose parameters' rows divide neither by 2 nor by 4 trains like DDP under every engine
and precision, at world sizes 2 and 4, including the fp16 rows whose first steps are skipped.

Why: sharding such a parameter leaves the ranks with shards of different sizes (the ``uneven``
workload's 5-class head is 3 + 2 rows on two ranks, 2 + 2 + 1 + 0 on four), so anything that
sizes a collective from a local shard disagrees between ranks; the fp16 rows skip their first
steps, so the optimizer state gathered after them is the zero placeholder the engine makes, whose
global shape must be stated, not inferred from the local shard. The whole grid runs under
``python -m harness.parity --workload uneven``; these are its fast rows: FSDP1 FULL_SHARD (flat
and original parameters), SHARD_GRAD_OP and, at world size 4, HYBRID_SHARD; FSDP2 resharding and
kept with CPU offload; each in fp32, fp16 and bf16 with SGD-momentum; and an inf on one rank
under each engine.

At world size 4 (four ranks on two cores: most of this module's time) ``make test`` runs a fixed
sample, :data:`SAMPLE_AT_4` and :data:`LOW_PRECISION_SAMPLE`: HYBRID_SHARD (world size 4 only),
an inf on FSDP2's uneven shards, an accumulation, fp16 under FSDP1 and bf16 under FSDP2. The
other rows at 4 are the ``world_sizes`` tier's (``make world-sizes``); ``test_world_size.py``
runs this workload at 4 bitwise under HYBRID_SHARD and FSDP2 in ``make test`` too (every FSDP1
strategy in the tier).
"""

import pytest

from harness.parity.doors import runner
from harness.parity.plan.config import ParityConfig
from harness.parity.plan.matrices import workload as workload_matrix
from suites.parity.support import describe, ranks_executor


def _fast_row(config: ParityConfig) -> bool:
    if config.optimizer != "sgd" or config.precision.recipe != "pure":  # recipes: test_recipe_parity.py
        return False
    if config.suite == "forced_inf":
        return all(f.rank == 1 and f.value == "inf" for f in config.faults)
    if config.engine == "fsdp1":
        if config.layout.sharding == "hybrid_shard":  # a 2 x 2 mesh: world size 4 only
            return config.world_size == 4 and bool(config.layout.use_orig_params)
        return (config.layout.sharding, config.layout.use_orig_params) in {
            ("full_shard", False),
            ("full_shard", True),
            ("shard_grad_op", False),
        }
    return config.layout.reshard_after_forward == (not config.layout.offload)


def _low_precision_on_four(config: ParityConfig) -> bool:
    return config.world_size == 4 and config.precision.dtype != "fp32"


_FAST = [
    config
    for world_size in (2, 4)
    for config in workload_matrix.for_workload("uneven", world_size=world_size)
    if _fast_row(config)
]
CONFIGS = [config for config in _FAST if not _low_precision_on_four(config)]
"""Rows that pass (bit-exact at world size 2, within ``fp32`` at 4): judged per test, with gate
curves."""
LOW_PRECISION_ON_FOUR = [config for config in _FAST if _low_precision_on_four(config)]
"""fp16/bf16 at world size 4: their verdict is the precision's (see the test), so they run here
without gate curves, asked only to be judged."""

SAMPLE_AT_4 = (
    "fsdp1-hybrid_shard-orig-fp32-sgd-uneven-w4",
    "fsdp2-reshard-fp32-sgd-uneven-inf@r1s2-inf@r1s5-w4",
    "fsdp1-full_shard-flat-fp32-sgd-uneven-acc2-synclast-w4",
)
"""The rows of :data:`CONFIGS` at world size 4 that ``make test`` runs."""
LOW_PRECISION_SAMPLE = ("fsdp1-full_shard-flat-fp16-sgd-uneven-w4", "fsdp2-reshard-bf16-sgd-uneven-w4")
"""The rows of :data:`LOW_PRECISION_ON_FOUR` that ``make test`` runs."""


def tier(config: ParityConfig) -> str | None:
    """World size 4 but :data:`SAMPLE_AT_4`: ``make world-sizes`` (conftest.py)."""
    if config.world_size == 4 and config.id not in SAMPLE_AT_4:
        return "world_sizes"
    return None


def test_the_samples_at_world_size_4_are_rows_of_this_module():
    """A renamed row would otherwise leave a sample quietly empty."""
    ids = {c.id for c in CONFIGS}
    assert set(SAMPLE_AT_4) <= ids, sorted(set(SAMPLE_AT_4) - ids)
    low = {c.id for c in LOW_PRECISION_ON_FOUR}
    assert set(LOW_PRECISION_SAMPLE) <= low, sorted(set(LOW_PRECISION_SAMPLE) - low)
    assert all(c.world_size == 2 for c in CONFIGS if tier(c) is None and c.id not in SAMPLE_AT_4)


def test_uneven_shards_train_like_ddp(parity_config, outcome):
    """Every row passes: no rank aborts on a collective whose sizes differ between ranks, and
    nothing gathered is cut at the wrong rows."""
    assert outcome.result.status == "pass", describe(outcome)


def test_fp16_rows_skip_their_first_step(parity_config, outcome):
    """The workload really reaches the placeholder path: at the initial scale, fp16 overflows at
    step 0, so the optimizer has no state when step 0's records are gathered."""
    if parity_config.precision.dtype != "fp16":
        return
    assert 0 in outcome.result.skipped_steps, outcome.result.skipped_steps
    assert 0 in outcome.result.reference_skipped_steps, outcome.result.reference_skipped_steps


def test_uneven_shards_in_low_precision_on_four_ranks_are_judged(module_ranks):
    """fp16/bf16 at world size 4 get a verdict, never an ERROR or a CRASH, and their fp16 rows
    skip step 0 too. Their verdict itself is the profile's business: summing four ranks' fp16/bf16
    gradients in another order (the reference's one all-reduce, FSDP's reduce-scatter per flat
    parameter or shard; both divide by FSDP's factors) moves this workload's values, which are near
    1, by a low-precision ulp (0.0078 in bf16), beyond ``bf16``'s atol; every such FAIL names that
    cause, ``reduce_order``, so a reader is told it is rounding, not sharding. ``make test``: the
    fixed sample; the next test, the rest."""
    _judged_in_low_precision(module_ranks, [c for c in LOW_PRECISION_ON_FOUR if c.id in LOW_PRECISION_SAMPLE])


@pytest.mark.world_sizes
def test_every_other_low_precision_row_on_four_ranks_is_judged(module_ranks):
    """As the test above, for every row of :data:`LOW_PRECISION_ON_FOUR` outside its sample."""
    _judged_in_low_precision(
        module_ranks, [c for c in LOW_PRECISION_ON_FOUR if c.id not in LOW_PRECISION_SAMPLE]
    )


def _judged_in_low_precision(module_ranks, configs: list[ParityConfig]) -> None:
    outcomes = runner.run(configs, ranks_executor(module_ranks), batch_size=16, localize=False)
    statuses = {o.result.config.id: o.result.status for o in outcomes}
    assert set(statuses.values()) <= {"pass", "fail"}, statuses
    unexplained = {
        o.result.config.id: o.result.reason
        for o in outcomes
        if o.result.status == "fail" and "reduce_order" not in [c.name for c in o.result.causes]
    }
    assert not unexplained, unexplained
    skipped = {
        o.result.config.id: o.result.skipped_steps
        for o in outcomes
        if o.result.config.precision.dtype == "fp16"
    }
    assert all(0 in steps for steps in skipped.values()), skipped
