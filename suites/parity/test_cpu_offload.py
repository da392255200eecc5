"""CPU offload: FSDP2 ``CPUOffloadPolicy(pin_memory=False)`` on the CPU tier, FSDP1
``CPUOffload(offload_params=True)`` on the GPU tier (it needs pinned memory), each with and without
an inf on rank 1 at step 2, in every precision, with SGD-momentum and fused Adam."""

from harness.parity.plan.matrices import default as matrix
from suites.parity.support import describe

CONFIGS = matrix.cpu_offload(world_size=2) + matrix.cpu_offload(world_size=1, backend="nccl")


def test_offloaded_training_matches_ddp(parity_config, outcome):
    assert outcome.result.status == "pass", describe(outcome)


def test_an_inf_on_one_rank_skips_the_step_on_every_rank(parity_config, outcome):
    for fault in parity_config.faults:
        flags = outcome.candidate.steps[fault.step].skipped
        assert all(f == (True,) for f in flags if f != (None,)), f"step {fault.step}: {flags}"
