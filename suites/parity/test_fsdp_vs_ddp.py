"""FSDP trains exactly like DDP under loss scaling: FSDP1 (every sharding strategy, flat and original
parameters) and FSDP2, in fp32, fp16 and bf16, with SGD-momentum, Adam (foreach) and fused Adam, on
the nested MLP, the tied-weight transformer and the frozen model with an empty shard.

fp32 at world size 2 is held bit-exact (``exact``); fused optimizers and world size 4
(HYBRID_SHARD as a 2x2 mesh) hold the documented profiles (``harness.parity.plan.profiles``).

HYBRID_SHARD's 18 rows at world size 4 (four ranks on two cores: most of this module's time) are
the ``world_sizes`` tier's, which also runs them through ``make world-sizes``' default matrix at
world size 4; ``make test`` keeps a fixed sample of three that covers flat and original
parameters, each precision and each optimizer (and ``test_world_size.py`` runs HYBRID_SHARD at
world size 4 bitwise, ``test_staged.py`` its fused-Adam row).
"""

from harness.parity.plan.config import ParityConfig
from harness.parity.plan.matrices import default as matrix
from suites.parity.support import describe

CONFIGS = [c for c in matrix.fsdp_vs_ddp(world_size=2) if c.layout.sharding != "hybrid_shard"] + [
    c for c in matrix.fsdp_vs_ddp(world_size=4) if c.layout.sharding == "hybrid_shard"
]

HYBRID_SAMPLE = (
    "fsdp1-hybrid_shard-flat-fp32-sgd-w4",
    "fsdp1-hybrid_shard-orig-fp16-adam-w4",
    "fsdp1-hybrid_shard-orig-bf16-adam_fused-w4",
)
"""The HYBRID_SHARD rows ``make test`` runs; the others are the ``world_sizes`` tier's."""


def tier(config: ParityConfig) -> str | None:
    """HYBRID_SHARD at world size 4 but the fixed sample: ``make world-sizes`` (conftest.py)."""
    if config.world_size == 4 and config.id not in HYBRID_SAMPLE:
        return "world_sizes"
    return None


def test_the_hybrid_sample_is_rows_of_this_module_and_the_tier_has_the_rest():
    """A renamed row would otherwise leave the sample quietly empty."""
    ids = {c.id for c in CONFIGS}
    assert set(HYBRID_SAMPLE) <= ids, sorted(set(HYBRID_SAMPLE) - ids)
    moved = [c.id for c in CONFIGS if tier(c) is not None]
    assert len(moved) == 15 and all(c.endswith("-w4") for c in moved), moved


def test_fsdp_trains_like_ddp(parity_config, outcome):
    """Every step: same skip decisions, scale and tracker on every rank as DDP, same losses,
    unscaled gradients, parameters and optimizer state within the configuration's profile."""
    assert outcome.result.status == "pass", describe(outcome)


def test_the_scale_moves_identically_on_every_rank(parity_config, outcome):
    scales = [step.scales for step in outcome.candidate.steps]
    assert all(len(set(per_rank)) == 1 for per_rank in scales), scales


def test_mixed_precision_rows_show_the_references_own_gap_to_fp32(parity_config, outcome):
    """The candidate is measured against the reference in its precision; the reference's own
    distance from a float32 run of the same workload is the gap the precision is expected to cost."""
    gap = outcome.result.expected_gap
    if parity_config.precision.dtype == "fp32":
        assert gap is None
    else:
        assert gap is not None and gap.loss_max_rel > 0 and gap.param_max_rel > 0, gap
