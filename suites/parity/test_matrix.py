"""The matrices are data: validated configurations with readable, unique ids."""

import pickle

import pytest

from harness.parity.plan import profiles
from harness.parity.plan.config import Fault, Layout, Loop, ParityConfig, Precision, Scale, unsupported_reason
from harness.parity.plan.matrices import default as matrix


def test_the_cpu_matrix_runs_at_least_100_configurations_at_world_size_2():
    runnable = [c for c in matrix.default_matrix() if unsupported_reason(c) is None]
    assert len(runnable) >= 100


def test_every_id_is_unique_across_suites_and_world_sizes():
    configs = matrix.default_matrix() + matrix.default_matrix(world_size=4)
    assert len({c.id for c in configs}) == len(configs)


def test_ids_name_the_fields_a_reader_needs():
    config = ParityConfig(
        engine="fsdp1",
        optimizer="adam_fused",
        faults=(Fault(step=2, rank=1), Fault(step=5, rank=None, value="nan")),
        layout=Layout(sharding="full_shard", use_orig_params=False),
        precision=Precision(dtype="fp16"),
        loop=Loop(path="unscale_clip"),
        scale=Scale(scaler="torch"),
    )
    assert (
        config.id == "fsdp1-full_shard-flat-fp16-adam_fused-unscale_clip-inf@r1s2-nan@alls5-torch_scaler-w2"
    )


def test_configurations_travel_to_the_ranks_by_pickle():
    config = matrix.forced_inf()[5]
    assert pickle.loads(pickle.dumps(config)) == config


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"engine": "fsdp3"}, "engine must be one of ('ddp', 'fsdp1', 'fsdp2', 'user'), got 'fsdp3'"),
        (
            {"engine": "fsdp1", "sharding": "full_shard"},
            "use_orig_params must be True or False for engine='fsdp1'",
        ),
        ({"engine": "fsdp2"}, "reshard_after_forward must be True or False for engine='fsdp2'"),
        (
            {"engine": "ddp", "sharding": "full_shard"},
            "sharding and use_orig_params apply to engine='fsdp1' only",
        ),
        ({"engine": "ddp", "offload": True}, "offload applies to FSDP engines only"),
        (
            {"engine": "ddp", "precision": "fp8"},
            "precision must be one of ('fp32', 'fp16', 'bf16'), got 'fp8'",
        ),
        ({"engine": "ddp", "faults": (Fault(step=9),)}, "fault inf@r1s9 lies past the last step (5)"),
        ({"engine": "ddp", "faults": (Fault(step=1, optimizer=1),)}, "names optimizer 1 but path='plain'"),
        (
            {"engine": "fsdp2", "reshard_after_forward": True, "workload": "embedding"},
            "runs as engine='ddp' against reference='single'",
        ),
        ({"engine": "ddp", "workload": "resnet"}, "unknown workload"),
        ({"engine": "ddp", "steps": 0}, "steps must be >= 1, got 0"),
    ],
)
def test_a_bad_configuration_is_refused_naming_the_field(changes, message):
    with pytest.raises(ValueError, match=None) as error:
        ParityConfig.from_flat(**changes)
    assert message in str(error.value)


def test_a_bad_fault_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"Fault.value must be one of \('inf', 'nan'\), got 'zero'"):
        Fault(step=1, value="zero")


def test_configurations_that_differ_only_in_how_the_candidate_shards_share_a_reference():
    fsdp1 = ParityConfig(engine="fsdp1", layout=Layout(sharding="no_shard", use_orig_params=True))
    fsdp2 = ParityConfig(engine="fsdp2", layout=Layout(reshard_after_forward=False))
    assert fsdp1.reference_key() == fsdp1.with_(sharding="full_shard", use_orig_params=False).reference_key()
    assert fsdp2.reference_key() == fsdp2.with_(reshard_after_forward=True, offload=True).reference_key()
    assert fsdp1.reference_key() != fsdp1.with_(precision="bf16").reference_key()


def test_fsdp1_and_fsdp2_get_references_of_their_own_as_their_twins_differ():
    """FSDP2 keeps buffers FSDP1 casts, casts inputs at every unit, and puts an autograd node on
    each unit's inputs: even in float32 its reference is not FSDP1's."""
    fsdp1 = ParityConfig(engine="fsdp1", layout=Layout(sharding="no_shard", use_orig_params=True))
    fsdp2 = ParityConfig(engine="fsdp2", layout=Layout(reshard_after_forward=False))
    assert fsdp1.reference_key() != fsdp2.reference_key()
    assert fsdp1.with_(precision="bf16").reference_key() != fsdp2.with_(precision="bf16").reference_key()


def test_what_cannot_run_on_gloo_says_why_and_where_it_runs():
    hybrid = ParityConfig(engine="fsdp1", layout=Layout(sharding="hybrid_shard", use_orig_params=False))
    assert "even world size >= 4, not 2 (run with --world-size 4)" in unsupported_reason(hybrid)
    assert unsupported_reason(hybrid.with_(world_size=4)) is None
    offload = ParityConfig(
        engine="fsdp1", layout=Layout(sharding="full_shard", use_orig_params=True, offload=True)
    )
    assert "the GPU tier runs it" in unsupported_reason(offload)
    nccl = ParityConfig(engine="ddp", backend="nccl")
    assert unsupported_reason(nccl, gpus=1) == "nccl world size 2 needs 2 CUDA GPUs, this machine has 1"


@pytest.mark.parametrize(
    ("config", "profile"),
    [
        (
            ParityConfig(
                engine="fsdp2", layout=Layout(reshard_after_forward=True), precision=Precision(dtype="bf16")
            ),
            "exact",
        ),
        (
            ParityConfig(
                engine="fsdp2",
                optimizer="adam_fused",
                layout=Layout(reshard_after_forward=True),
                precision=Precision(dtype="fp16"),
            ),
            "exact",  # its reference steps the candidate's shards (ranks/sides/optim/step_pieces.py)
        ),
        (
            ParityConfig(
                engine="fsdp2",
                world_size=4,
                layout=Layout(reshard_after_forward=True),
                precision=Precision(dtype="fp16"),
            ),
            "exact",
        ),
        (
            ParityConfig(
                engine="fsdp1",
                world_size=8,
                layout=Layout(sharding="hybrid_shard", use_orig_params=True),
                precision=Precision(dtype="bf16"),
            ),
            "exact",
        ),
        (ParityConfig(engine="fsdp2", backend="nccl", layout=Layout(reshard_after_forward=True)), "fp32"),
        (
            ParityConfig(
                engine="fsdp2",
                backend="nccl",
                layout=Layout(reshard_after_forward=True),
                precision=Precision(dtype="bf16"),
            ),
            "bf16",
        ),
    ],
)
def test_gloo_is_held_bit_exact_at_every_world_size_and_nccl_to_its_fallback_profile(config, profile):
    assert profiles.profile_for(config).name == profile


def test_a_tolerance_profile_refuses_a_negative_tolerance():
    with pytest.raises(ValueError, match="rtol must be >= 0, got -0.001"):
        profiles.ToleranceProfile(name="bad", rtol=-0.001, atol=0.0)
