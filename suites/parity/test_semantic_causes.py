"""The ground truth's known causes (``judge/causes/semantics.py``) on hand-made steps: each named
when its pattern and its premise hold, ruled out (with why) when what was measured refutes the
premise. No ranks, no training."""

import dataclasses

from harness.parity.judge.causes import semantics as causes
from harness.parity.ranks.wire import TruthStep

_SPLIT = causes.Split(ranks=2, microbatches=2)
_PIECES = ("rank 0 microbatch 0", "rank 0 microbatch 1", "rank 1 microbatch 0", "rank 1 microbatch 1")


def _step(**fields) -> TruthStep:
    base = {
        "step": 2,
        "distance": 0.2,
        "rounding": 1e-16,
        "pieces": _PIECES,
        "counts": (10, 30, 20, 20),
        "counted": "items",
        "factor": 0.25,
    }
    return TruthStep(**{**base, **fields})


def test_weights_in_proportion_to_the_counts_are_named_loss_normalization():
    found, ruled_out = causes.weigh(_step(weights=(0.125, 0.375, 0.25, 0.25), weights_residual=1e-16), _SPLIT)
    assert found is not None and found.name == "loss_normalization" and not ruled_out
    assert "each in proportion to its count of items" in found.evidence


def test_loss_normalization_is_ruled_out_when_a_module_already_differs():
    step = _step(
        weights=(0.125, 0.375, 0.25, 0.25), weights_residual=1e-16, module=("bn", "BatchNorm1d", 0.3)
    )
    found, ruled_out = causes.weigh(step, _SPLIT)
    assert found is not None and found.name == "batchnorm_per_rank"
    step = _step(weights=(0.125, 0.375, 0.25, 0.25), weights_residual=1e-16, module=("mix", "Mixer", 0.3))
    found, ruled_out = causes.weigh(step, _SPLIT)
    assert found is None
    assert [r.name for r in ruled_out] == ["loss_normalization"] and "module mix (Mixer)" in ruled_out[0].why


def test_weights_that_do_not_fit_name_no_normalization():
    found, _ = causes.weigh(_step(weights=(0.1, 0.4, 0.2, 0.3), weights_residual=0.05), _SPLIT)
    assert found is None or found.name != "loss_normalization"


def test_one_weight_for_every_piece_is_named_microbatch_scaling_with_its_factor():
    found, _ = causes.weigh(_step(weights=(0.5,) * 4, weights_residual=1e-16), _SPLIT)
    assert found is not None and found.name == "microbatch_scaling"
    assert "0.5 times" in found.evidence and "1 / 2 data-parallel ranks" in found.evidence


def test_the_splits_own_weight_is_no_scaling():
    found, _ = causes.weigh(_step(weights=(0.25,) * 4, weights_residual=1e-16, distance=2e-9), _SPLIT)
    assert found is None


def test_repeated_samples_are_named_sampler_padding_when_they_alone_explain_the_difference():
    step = _step(repeats=("rank 1 microbatch 1 row 3 = rank 0 microbatch 0 row 0",), as_served=1e-16)
    found, _ = causes.weigh(step, _SPLIT)
    assert found is not None and found.name == "sampler_padding" and "drop_last" in found.explanation


def test_sampler_padding_is_ruled_out_when_the_batch_as_served_differs_too():
    step = _step(repeats=("rank 1 microbatch 1 row 3 = rank 0 microbatch 0 row 0",), as_served=0.1)
    found, ruled_out = causes.weigh(step, _SPLIT)
    assert found is None
    assert [r.name for r in ruled_out] == ["sampler_padding"]
    assert "something more than the repeats differs" in ruled_out[0].why


def test_a_syncbatchnorm_is_named_only_for_its_statistics_per_microbatch():
    one = causes.Split(ranks=2, microbatches=1)
    assert causes.weigh(_step(module=("bn", "SyncBatchNorm", 0.3)), one)[0] is None
    found, _ = causes.weigh(_step(module=("bn", "SyncBatchNorm", 0.3)), _SPLIT)
    assert found is not None and "each of the 2 microbatches" in found.evidence


def test_forward_that_agrees_with_no_weights_that_fit_is_named_loss_couples_samples():
    found, _ = causes.weigh(_step(weights=(0.1, 0.4, 0.2, 0.3), weights_residual=0.05), _SPLIT)
    assert found is not None and found.name == "loss_couples_samples"
    found, ruled_out = causes.weigh(
        _step(weights=(0.1, 0.4, 0.2, 0.3), weights_residual=0.05, module=("mix", "Mixer", 0.2)), _SPLIT
    )
    assert found is None and [r.name for r in ruled_out] == ["loss_couples_samples"]


def test_the_pngs_title_says_which_splits_train_unlike_the_whole_batch():
    from harness.parity.judge import semantics
    from harness.parity.judge.evidence import Cause
    from harness.parity.judge.result import ParityResult
    from harness.parity.plan.config import ParityConfig
    from harness.parity.report.plot import ground_truth_line

    cause = Cause(name="loss_normalization", evidence="", explanation="", reference="")
    failed = semantics.Semantics(name="tokens-dp2", status="fail", step=0, cause=cause)
    passed = semantics.Semantics(name="mlp-dp2", status="pass")
    row = ParityResult(config=ParityConfig(engine="ddp"), status="pass", profile="exact")
    rows = [dataclasses.replace(row, semantics=verdict) for verdict in (failed, passed)]
    assert (
        "1 of 2 split(s) train UNLIKE the whole batch: tokens-dp2 at step 0 (loss_normalization)"
        in ground_truth_line(rows)
    )
    assert "each trains like the whole batch" in ground_truth_line(rows[1:])
    assert ground_truth_line([row]) == ""
