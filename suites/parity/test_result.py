"""Verdicts: which rows are expected to fail, and what a batch that never came back means."""

import pytest

from harness.parity.judge.result import expected_failure, failed_batch
from harness.parity.plan.config import Fault, Layout, Loop, ParityConfig, Scale


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            ParityConfig(
                engine="ddp", optimizer="adam_fused", faults=(Fault(step=1),), scale=Scale(scaler="torch")
            ),
            "never agrees",
        ),
        (
            ParityConfig(
                engine="ddp",
                optimizer="adam_fused",
                faults=(Fault(step=1, rank=None),),
                scale=Scale(scaler="torch"),
            ),
            "",
        ),
        (
            ParityConfig(engine="ddp", optimizer="sgd", faults=(Fault(step=1),), scale=Scale(scaler="torch")),
            "",
        ),
        (
            ParityConfig(
                engine="fsdp2",
                optimizer="adam_fused",
                faults=(Fault(step=1),),
                layout=Layout(reshard_after_forward=True),
                scale=Scale(scaler="torch"),
            ),
            "",
        ),
        (
            ParityConfig(
                engine="fsdp2",
                optimizer="adam_fused",
                layout=Layout(reshard_after_forward=True),
                loop=Loop(path="unscale_clip"),
                scale=Scale(scaler="torch"),
            ),
            "crashes",
        ),
        (
            ParityConfig(
                engine="fsdp2",
                optimizer="adam_fused",
                layout=Layout(reshard_after_forward=True),
                loop=Loop(path="unscale_clip"),
            ),
            "",
        ),
    ],
)
def test_torch_rows_are_expected_to_fail_only_where_torchs_scaler_is_wrong(config, expected):
    reason = expected_failure(config)
    assert (expected in reason) if expected else reason == ""


def test_a_batch_that_failed_on_the_ranks_is_an_error_naming_the_harness_verdict():
    config = ParityConfig(engine="ddp")
    result = failed_batch(
        config, "1 of 2 ranks did not pass; root cause: rank 1 died with signal SIGKILL (-9)\n..."
    )
    assert result.status == "error" and result.broken
    assert (
        result.reason
        == "the batch failed on the ranks: 1 of 2 ranks did not pass; root cause: rank 1 died with signal SIGKILL (-9)"
    )


def test_gradients_are_not_compared_at_planted_faults_nor_at_the_sparse_overflow_step():
    from harness.parity.judge.result import poisoned_steps
    from harness.parity.workload import registry

    assert poisoned_steps(ParityConfig(engine="ddp", faults=(Fault(step=1), Fault(step=4)))) == {1, 4}
    sparse = ParityConfig(suite="sparse", engine="ddp", reference="single", workload="embedding")
    assert poisoned_steps(sparse) == {registry.OVERFLOW_STEP}
