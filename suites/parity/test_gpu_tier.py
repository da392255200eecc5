"""The GPU tier (``make test-gpu``): the parity matrix on NCCL with one GPU per rank, at world sizes
2 and 1. With fewer GPUs than ranks a configuration is skipped at collection, starting no process;
at world size 1 the faults planted on rank 1 cannot happen and those configurations are skipped."""

from harness.parity.plan.config import unique
from harness.parity.plan.matrices import default as matrix
from suites.parity.support import describe

CONFIGS = unique(
    [
        *matrix.default_matrix(world_size=2, backend="nccl"),
        *matrix.default_matrix(world_size=1, backend="nccl"),
    ]
)


def test_the_configuration_trains_like_its_reference_on_gpus(parity_config, outcome):
    assert outcome.result.status == "pass", describe(outcome)
