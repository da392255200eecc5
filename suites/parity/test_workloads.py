"""Workloads by name or ``module:function``: resolution, the built-ins, seeding, and every mistake a
user can make named with its fix (controller side: no ranks)."""

import dataclasses

import pytest
import torch

from fixtures import user_workloads
from harness.parity import ParityConfig, Workload, WorkloadError
from harness.parity.plan.config import Layout
from harness.parity.plan.matrices import workload as workload_matrix
from harness.parity.workload import registry, units
from harness.parity.workload.checks import check

SPEC = "fixtures.user_workloads:resmlp"


@pytest.mark.parametrize("name", sorted(registry.BUILTIN))
def test_every_builtin_is_a_workload_made_by_its_registered_factory(name):
    workload = registry.get(name)
    assert isinstance(workload, Workload) and workload.name == name
    check(workload)


def test_a_spec_resolves_to_the_factorys_workload_once_per_process():
    assert registry.get(SPEC) is registry.get(SPEC)
    assert registry.get(SPEC).units == (user_workloads.ResBlock,)


def test_a_module_level_factory_is_named_by_its_spec():
    assert registry.spec_of(user_workloads.resmlp) == SPEC


def test_a_closure_cannot_be_a_factory_because_ranks_import_by_name():
    def local() -> Workload:
        return user_workloads.resmlp()

    with pytest.raises(WorkloadError, match="not a module-level function"):
        registry.spec_of(local)


def test_the_configuration_id_carries_the_workload_name_and_pickles_as_the_spec():
    config = ParityConfig(engine="fsdp2", workload=SPEC, layout=Layout(reshard_after_forward=True))
    assert config.id == "fsdp2-reshard-fp32-sgd-resmlp-w2"
    assert config.workload == SPEC


def test_a_batch_is_drawn_from_torchs_rng_seeded_per_seed_rank_and_step():
    workload = registry.get(SPEC)
    first = registry.make_batch(workload, 0, 1, 2)
    assert torch.equal(first[0], registry.make_batch(workload, 0, 1, 2)[0])
    assert not torch.equal(first[0], registry.make_batch(workload, 0, 0, 2)[0])
    assert not torch.equal(first[0], registry.make_batch(workload, 0, 1, 3)[0])


def test_drawing_a_batch_leaves_the_callers_rng_where_it_was():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    registry.make_batch(registry.get(SPEC), 0, 0, 0)
    assert torch.equal(torch.rand(3), expected)


def test_a_workloads_own_optimizer_replaces_the_matrix_optimizers_and_a_fused_one_is_known():
    spec = "fixtures.user_workloads:resmlp_adamw"
    configs = workload_matrix.for_workload(spec)
    assert {c.optimizer for c in configs} == {"own"}
    assert all(c.fused for c in configs)
    assert {c.optimizer for c in workload_matrix.for_workload(SPEC)} == {"sgd", "adam_fused"}


def test_the_workload_matrix_covers_both_fsdp_engines_three_precisions_and_planted_faults():
    configs = workload_matrix.for_workload(SPEC)
    assert {c.engine for c in configs} == {"ddp", "fsdp1", "fsdp2"}
    assert {c.layout.sharding for c in configs if c.engine == "fsdp1"} == {
        "full_shard",
        "shard_grad_op",
        "no_shard",
        "hybrid_shard",
    }
    assert {(c.precision.dtype, c.layout.offload) for c in configs if c.engine == "fsdp2"} == {
        (p, o) for p in ("fp32", "fp16", "bf16") for o in (False, True)
    }
    faults = {(f.rank, f.value) for c in configs for f in c.faults}
    assert faults == {(1, "inf"), (1, "nan"), (None, "inf"), (None, "nan")}


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [
        ("no_such_module:f", "no module named 'no_such_module'; run from the folder that holds"),
        ("fixtures.user_workloads:nope", "has no attribute 'nope'; its functions are ["),
        ("fixtures.user_workloads:returns_a_dict", "returns_a_dict() returned dict, not a Workload"),
        ("fixtures.user_workloads:raises", "RuntimeError: the data folder /data/resmlp is missing"),
        ("no_such_name", "unknown workload 'no_such_name': give 'module:function'"),
        ("fixtures.user_workloads", "unknown workload"),
    ],
)
def test_a_workload_that_cannot_be_resolved_says_why(spec, complaint):
    with pytest.raises(WorkloadError) as raised:
        registry.get(spec)
    assert complaint in str(raised.value)


def test_an_import_error_inside_the_users_module_is_shown_with_its_line(tmp_path, monkeypatch):
    (tmp_path / "broken_module.py").write_text("import not_installed_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(WorkloadError) as raised:
        registry.get("broken_module:f")
    message = str(raised.value)
    assert "importing 'broken_module' failed" in message
    assert 'broken_module.py", line 1' in message
    assert "No module named 'not_installed_anywhere'" in message


def test_loss_parallel_without_tensor_parallelism_is_refused_naming_what_it_needs():
    with pytest.raises(WorkloadError, match="loss_parallel=True needs tensor parallelism"):
        dataclasses.replace(user_workloads.resmlp(), loss_parallel=True)


def test_a_name_that_is_not_one_word_is_refused():
    with pytest.raises(WorkloadError, match="Workload.name must be one word"):
        dataclasses.replace(user_workloads.resmlp(), name="res-mlp")


@pytest.mark.parametrize(
    ("factory", "complaint"),
    [
        ("units_not_in_model", "units class Conv2d does not occur in the model"),
        ("loss_not_scalar", "must return a floating-point scalar tensor, got (4,)"),
        ("loss_not_finite", "the loss at step 0 is inf"),
        ("data_not_deterministic", "returned different data on two calls. Data that is not deterministic"),
        (
            "auto_without_names",
            "units='auto' reads ResMLP._no_split_modules, which is None; name the FSDP units yourself, "
            "e.g. units=(MyDecoderLayer,)",
        ),
    ],
)
def test_a_workload_that_cannot_give_meaningful_runs_is_rejected_before_training(factory, complaint):
    with pytest.raises(WorkloadError) as raised:
        check(registry.get(f"fixtures.user_workloads:{factory}"))
    assert complaint in str(raised.value)


def test_auto_units_are_the_classes_the_models_no_split_modules_names():
    workload = registry.get("fixtures.user_workloads:resmlp_auto")
    model = registry.build_model(workload, 0)
    assert units.resolve(workload, model) == (user_workloads.ResBlock,)
    assert units.describe(workload, model) == "ResBlock (auto, from NamedResMLP._no_split_modules)"


def test_explicit_units_are_described_by_their_class_names():
    workload = registry.get("fixtures.user_workloads:resmlp")
    assert units.describe(workload, registry.build_model(workload, 0)) == "ResBlock"
