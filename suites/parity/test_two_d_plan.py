"""The 2-D axes before any rank runs: what a configuration, a plan, the CLI and ``parity_test``
accept, and the error that names the fix for what they refuse. Pure: no ranks."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from harness.parity import Workload
from harness.parity.doors import pytest_plugin
from harness.parity.doors.testing import parity_test
from harness.parity.plan.config import Layout, Mesh, ParityConfig, unsupported_reason
from harness.parity.workload import registry, tp_plan
from harness.parity.workload.builtin import llama
from harness.parity.workload.spec import WorkloadError
from suites.parity.support import cli_in_process

_FSDP2 = {"engine": "fsdp2", "reshard_after_forward": True, "workload": "llama", "world_size": 4}


def test_ids_name_the_mesh_and_the_references_of_different_meshes_are_kept_apart():
    hsdp = ParityConfig.from_flat(**_FSDP2, hsdp=2)
    whole = ParityConfig.from_flat(**_FSDP2, hsdp=4)
    tp = ParityConfig.from_flat(**_FSDP2, tp=2)
    plain = ParityConfig.from_flat(**_FSDP2)
    assert [c.id for c in (hsdp, whole, tp)] == [
        "fsdp2-hsdp2x2-reshard-fp32-sgd-llama-w4",
        "fsdp2-hsdp4x1-reshard-fp32-sgd-llama-w4",
        "fsdp2-tp2-reshard-fp32-sgd-llama-w4",
    ]
    assert len({c.reference_key() for c in (hsdp, whole, tp, plain)}) == 4
    assert tp.mesh.data_rank(3) == 1 and plain.mesh.data_rank(3) == 3
    assert tp.mesh.data_parallel_size(4) == 2 and hsdp.mesh.data_parallel_size(4) == 4


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"hsdp": 2, "tp": 2}, "set hsdp alone, or tp, pp, or both"),
        ({"hsdp": 3}, "divides world_size 4"),
        ({"hsdp": 1}, "leave it None"),
        ({"tp": 1}, "tp=1 is no tensor parallelism: leave it None"),
        ({"tp": 8}, "tp must be a degree that divides world_size 4"),
        ({"tp": 2, "workload": "mlp"}, "tp_plan='auto'"),
        ({"tp": 2, "offload": True}, "plain loop"),
        ({"tp": 2, "accumulate": 2}, "plain loop"),  # the hand accumulation divides over the world
        ({"hsdp": 2, "accumulate": 2}, "plain loop"),
    ],
)
def test_a_2d_layout_the_engine_cannot_run_is_refused_naming_the_fix(fields, words):
    with pytest.raises(ValueError) as raised:
        ParityConfig.from_flat(**{**_FSDP2, **fields})
    assert words in str(raised.value)


def test_a_2d_layout_of_another_engine_is_refused():
    with pytest.raises(ValueError, match="engine='fsdp2', not 'fsdp1'"):
        ParityConfig(
            engine="fsdp1",
            world_size=4,
            layout=Layout(sharding="full_shard", use_orig_params=True),
            mesh=Mesh(hsdp=2),
        )


def test_a_2d_row_below_four_ranks_is_skipped_with_the_flag_to_use():
    reason = unsupported_reason(ParityConfig.from_flat(**{**_FSDP2, "world_size": 2, "tp": 2}))
    assert reason is not None and "--world-size 4" in reason


def _workload(plan: object) -> Workload:
    return Workload(
        name="w", model=llama.Decoder, batch=llama.token_batch, loss=llama.next_token_loss, tp_plan=plan
    )


def test_plan_patterns_match_one_name_part_each_as_parallelize_module_does():
    assert tp_plan.matches("layers.*.attention.q", "layers.1.attention.q")
    assert not tp_plan.matches("layers.*.q", "layers.1.attention.q")
    assert not tp_plan.matches("layers.*", "layers.1.attention")
    styled = tp_plan.styled_modules(llama.tp_plan(), llama.Decoder())
    assert [name for name, _ in styled][:5] == [
        "layers.0.attention.q",
        "layers.0.attention.k",
        "layers.0.attention.v",
        "layers.0.attention.o",
        "layers.0.ffn.gate",
    ]
    assert len(styled) == 2 * 7


def test_the_reference_knows_which_dim_tp_shards_each_parameter_on():
    """What FSDP2 over ``dp`` reduces of a TP'd parameter is its TP share; the reference lays out
    each TP coordinate's shares (``reduce_layout._tp_bucket``)."""
    model = llama.Decoder()
    dims = tp_plan.sharded_dims(llama.sequence_parallel_plan(), model)
    assert dims["layers.0.attention.q.weight"] == 0  # colwise: output rows
    assert dims["layers.1.ffn.down.weight"] == 1  # rowwise: input columns
    assert "layers.0.ffn_norm.weight" not in dims and "embed.weight" not in dims  # whole on every rank
    assert len(dims) == 2 * 7


def test_a_plan_key_that_matches_no_module_is_an_error_naming_it():
    """parallelize_module would skip it with a warning and train that module without TP."""
    workload = _workload({"layers.*.attn.q": ColwiseParallel()})
    with pytest.raises(WorkloadError, match=r"'layers\.\*\.attn\.q' matches no module"):
        tp_plan.resolve(workload, llama.Decoder())


def test_auto_on_a_model_without_base_model_tp_plan_is_an_error_naming_the_fix():
    with pytest.raises(WorkloadError, match="base_model_tp_plan.*give the plan yourself"):
        tp_plan.resolve(_workload("auto"), llama.Decoder())


def test_a_plan_that_is_not_a_dict_of_styles_is_refused_naming_the_fix():
    with pytest.raises(WorkloadError, match="tp_plan must be a non-empty dict"):
        _workload([ColwiseParallel()])


def test_auto_reads_hugging_face_llamas_plan_under_its_base_model():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    )
    plan = tp_plan.resolve(_workload("auto"), transformers.LlamaForCausalLM(config))
    assert isinstance(plan["model.layers.*.self_attn.q_proj"], ColwiseParallel)
    assert isinstance(plan["model.layers.*.mlp.down_proj"], RowwiseParallel)
    assert len(plan) == 7


def test_the_twin_refuses_a_style_it_cannot_mirror_before_training():
    from harness.parity.ranks.sides.tp import mirror as tp_mirror

    with pytest.raises(ValueError, match="is a Conv1d under ColwiseParallel"):
        tp_mirror.mirror(nn.Sequential(nn.Conv1d(4, 4, 1)), {"0": ColwiseParallel()}, 2)


def test_the_twin_reads_a_prepare_module_input_output_by_its_input_half():
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInputOutput

    from harness.parity.ranks.sides.tp import mirror as tp_mirror

    def style(use_local_input: bool) -> PrepareModuleInputOutput:
        return PrepareModuleInputOutput(
            input_layouts=Shard(1),
            desired_input_layouts=Replicate(),
            use_local_input=use_local_input,
            output_layouts=Replicate(),
            desired_output_layouts=Shard(1),
        )

    model = nn.Sequential(nn.Sequential(nn.Linear(4, 4)), nn.Sequential(nn.Linear(4, 4)))
    done = tp_mirror.mirror(model, {"0": style(False), "1": style(True)}, 2)
    assert done == [("0", "replicated"), ("1", "layout")]


def test_the_twin_splits_a_row_split_linear_with_a_bias():
    from harness.parity.ranks.sides.tp import mirror as tp_mirror

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4, bias=True))
    assert tp_mirror.mirror(model, {"0": ColwiseParallel(), "1": RowwiseParallel()}, 2) == [
        ("0", "colwise"),
        ("1", "rowwise"),
    ]
    x = torch.randn(3, 4)
    split = model(x)
    whole = nn.functional.linear(nn.functional.linear(x, model[0].weight, model[0].bias), model[1].weight)
    torch.testing.assert_close(split, whole + model[1].bias)  # the bias added once, in halves


def test_the_cli_runs_the_2d_matrix_with_tp_and_says_the_plan():
    done = cli_in_process("--workload", "llama", "--world-size", "4", "--tp", "2", "--list")
    assert done.returncode == 0, done.stderr
    assert "fsdp2-tp2-reshard-bf16-reduce32-adamw-llama-w4" in done.stdout
    assert "fsdp2-hsdp4x1-reshard-fp32-sgd-llama-w4" in done.stdout
    assert "tp plan of llama: layers.*.attention.q ColwiseParallel" in done.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--tp", "2", "--world-size", "4"), "--tp runs a --workload's 2-D matrix"),
        (("--workload", "llama", "--tp", "2"), "--world-size 4 or more"),
        (
            ("--workload", "mlp", "--tp", "2", "--world-size", "4"),
            "'mlp' has no tp_plan: give it Workload(tp_plan=",
        ),
    ],
)
def test_the_cli_refuses_tp_without_a_workload_or_a_2d_world(args, words):
    done = cli_in_process(*args, "--list")
    assert done.returncode == 2 and words in done.stderr, done.stderr


def test_parity_test_with_tp_expands_the_2d_matrix_and_refuses_a_1d_world():
    configs = pytest_plugin._configs("llama", {"tp": 2, "world_size": 4, "k": "tp2"})
    assert {c.mesh.tp for c in configs} == {2} and len(configs) == 9
    with pytest.raises(
        ValueError, match=r"world_size=4 or more.*parity_test\(workload, mesh=Mesh\(tp=2\), world_size=4\)"
    ):
        parity_test("llama", mesh=Mesh(tp=2))


def test_the_built_in_decoder_declares_megatrons_plan():
    assert registry.get("llama").tp_plan is not None


def test_a_tp_degree_that_splits_a_hugging_face_models_heads_is_refused_naming_the_fix():
    pytest.importorskip("transformers")
    from harness.parity.workload.spec import WorkloadError
    from suites.models import workloads

    narrow, wide = workloads.llama(), workloads.llama_wide()  # 2 and 4 key-value heads
    with pytest.raises(WorkloadError) as refused:
        tp_plan.check_degree(narrow, narrow.model(), 4)
    assert "tp 4 splits LlamaForCausalLM's 2 key-value heads (num_key_value_heads)" in str(refused.value)
    assert "use a tp that divides 2 (2)" in str(refused.value)
    tp_plan.check_degree(narrow, narrow.model(), 2)
    tp_plan.check_degree(wide, wide.model(), 4)
