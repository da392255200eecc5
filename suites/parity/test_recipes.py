"""Precision recipes are a dimension of the matrix: named in ids, ``--list`` and ``-k``; each with a
reference of its own; declared by a user's workload, the CLI or ``parity_test`` (no ranks here)."""

import pytest

from harness.parity.doors import pytest_plugin
from harness.parity.plan import recipe
from harness.parity.plan.config import ParityConfig, Precision
from harness.parity.plan.matrices import default as matrix
from harness.parity.plan.matrices import workload as workload_matrix
from harness.parity.plan.matrices.declared import Declared
from harness.parity.plan.precision import PrecisionPolicy
from harness.parity.plan.select import select
from harness.parity.workload.spec import WorkloadError
from suites.parity.support import cli_in_process

FSDP2 = {"engine": "fsdp2", "reshard_after_forward": True}
FSDP1 = {"engine": "fsdp1", "sharding": "full_shard", "use_orig_params": False}
DECLARED = "fixtures.recipe_workloads:resmlp_bf16_reduce32"


def _of(name, **fields):
    kind, precision = recipe.parse(name)
    return ParityConfig.from_flat(**{**FSDP2, **fields}, recipe=kind, precision=precision)


def test_every_recipe_name_parses_back_to_itself():
    assert recipe.RECIPES == (
        "pure-fp16",
        "pure-bf16",
        "fp16-reduce32",
        "bf16-reduce32",
        "autocast-fp16",
        "autocast-bf16",
        "mixed-fp16",
        "mixed-bf16",
    )
    assert all(_of(name).recipe_name == name for name in recipe.RECIPES)


def test_an_unknown_recipe_is_refused_listing_the_names():
    with pytest.raises(ValueError, match=r"recipe must be one of \('pure-fp16'"):
        recipe.parse("fp8-magic")


def test_the_pure_rows_keep_the_ids_they_had():
    assert (
        _of("pure-bf16").id
        == ParityConfig.from_flat(**FSDP2, precision="bf16").id
        == "fsdp2-reshard-bf16-sgd-w2"
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("fp16-reduce32", "fsdp2-reshard-fp16-reduce32-sgd-w2"),
        ("autocast-fp16", "fsdp2-reshard-autocast-fp16-sgd-w2"),
        ("mixed-bf16", "fsdp2-reshard-mixed-bf16-sgd-w2"),
    ],
)
def test_a_recipe_beyond_pure_is_named_in_the_id(name, expected):
    assert _of(name).id == expected


def test_a_float32_configuration_has_no_recipe_so_its_fp32_twin_is_plain_fp32():
    twin = _of("mixed-fp16").with_(precision="fp32")
    assert (
        twin.precision.recipe == "pure"
        and twin.precision.autocast is None
        and twin == ParityConfig.from_flat(**FSDP2)
    )


def test_autocast_keeps_float32_parameters_and_mixed_adds_fsdps_policy():
    assert _of("autocast-fp16").policy is None and _of("autocast-fp16").precision.autocast == "fp16"
    assert (
        _of("mixed-bf16").policy == _of("pure-bf16").policy and _of("mixed-bf16").precision.autocast == "bf16"
    )
    assert _of("pure-bf16").precision.autocast is None


def test_reduce32_reduces_in_fp32_and_keeps_the_engines_other_defaults():
    fsdp1 = _of("bf16-reduce32", **FSDP1, reshard_after_forward=None)
    assert fsdp1.policy == PrecisionPolicy(param="bf16", reduce="fp32", buffers="bf16", inputs="root")
    assert _of("bf16-reduce32").policy == PrecisionPolicy(param="bf16", reduce="fp32", inputs="units")


def test_every_recipe_has_a_reference_of_its_own():
    keys = {_of(name).reference_key() for name in recipe.RECIPES}
    assert len(keys) == len(recipe.RECIPES)


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        (
            {
                "recipe": "autocast",
                "precision": "fp16",
                "mixed": PrecisionPolicy(param="fp16", inputs="units"),
            },
            "recipe 'autocast' keeps float32 parameters",
        ),
        (
            {
                "recipe": "reduce32",
                "precision": "bf16",
                "mixed": PrecisionPolicy(param="bf16", inputs="units"),
            },
            "recipe 'reduce32' reduces in fp32, but mixed.reduce is 'bf16'",
        ),
        ({"recipe": "fp8", "precision": "bf16"}, "recipe must be one of ('pure', 'reduce32'"),
    ],
)
def test_a_recipe_the_configuration_cannot_run_is_refused_naming_why(fields, complaint):
    with pytest.raises(ValueError) as error:
        ParityConfig.from_flat(**FSDP2, **fields)
    assert complaint in str(error.value)


def test_a_ddp_candidate_runs_the_pure_recipe_only():
    with pytest.raises(ValueError, match="a DDP candidate runs 'pure' only"):
        ParityConfig(engine="ddp", precision=Precision(recipe="autocast", dtype="fp16"))


def test_the_default_matrix_runs_every_recipe_in_a_few_rows():
    configs = matrix.default_matrix()
    beyond_pure = [
        c for c in configs if c.precision.recipe != "pure" and c.loop.accumulate == 1
    ]  # not the loop rows
    assert {c.recipe_name for c in configs} == {"fp32", *recipe.RECIPES}
    assert len(beyond_pure) == 16
    assert {c.engine for c in beyond_pure} == {"fsdp1", "fsdp2"}


def test_k_selects_a_recipe_by_name():
    configs = matrix.default_matrix()
    chosen = select(configs, "recipe=autocast-fp16")
    assert [c.id for c in chosen] == [
        "fsdp1-full_shard-flat-autocast-fp16-sgd-w2",
        "fsdp2-reshard-autocast-fp16-sgd-w2",
        "fsdp2-reshard-autocast-fp16-sgd-transformer-w2",
    ]
    assert {c.recipe_name for c in select(configs, "pure-bf16")} == {"pure-bf16"}


def test_a_workload_without_a_recipe_runs_every_recipe_under_four_layouts():
    configs = [c for c in workload_matrix.for_workload("mlp") if c.precision.recipe != "pure"]
    assert {c.recipe_name for c in configs} == set(recipe.RECIPES) - {"pure-fp16", "pure-bf16"}
    per_recipe = {
        (
            c.engine,
            c.layout.sharding,
            c.layout.use_orig_params,
            c.layout.reshard_after_forward,
            c.layout.offload,
        )
        for c in configs
    }
    assert len(per_recipe) == 4 and len(configs) == 6 * 4 * 2  # recipes x layouts x optimizers


def test_a_declared_recipe_runs_under_every_engine_layout_and_no_other_recipe():
    configs = [c for c in workload_matrix.for_workload(DECLARED) if c.precision.recipe != "pure"]
    assert {c.recipe_name for c in configs} == {"bf16-reduce32"}
    assert {c.layout.sharding for c in configs if c.engine == "fsdp1"} == {
        "full_shard",
        "shard_grad_op",
        "no_shard",
        "hybrid_shard",
    }
    assert {(c.layout.reshard_after_forward, c.layout.offload) for c in configs if c.engine == "fsdp2"} == {
        (r, o) for r in (True, False) for o in (False, True)
    }


def test_the_callers_recipe_replaces_the_workloads_own():
    configs = workload_matrix.for_workload(DECLARED, declared=Declared(recipe="autocast-fp16"))
    assert {c.recipe_name for c in configs if c.precision.recipe != "pure"} == {"autocast-fp16"}


def test_an_unknown_declared_recipe_is_a_workload_error_listing_the_names():
    with pytest.raises(WorkloadError, match=r"'resmlp_fp8': recipe must be one of \('pure-fp16'"):
        workload_matrix.for_workload("fixtures.recipe_workloads:resmlp_fp8")


def test_parity_test_passes_its_recipe_to_the_workloads_matrix():
    configs = pytest_plugin._configs(
        "mlp",
        {
            "declared": Declared(recipe="mixed-bf16"),
            "k": "mixed and not (unscale_clip or ckpt) and accumulate=1",
        },
    )
    assert {c.recipe_name for c in configs} == {"mixed-bf16"} and len(configs) == 12 * 2


def _cli(*args):
    return cli_in_process(*args)


def test_the_cli_lists_the_declared_recipe_and_its_rows():
    done = _cli("--workload", DECLARED, "--recipe", "mixed-fp16", "--list", "-k", "mixed and fsdp2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "fsdp2-reshard-offload-mixed-fp16-sgd-resmlp_declared-w2" in lines
    assert "recipe of resmlp_declared: mixed-fp16 (under every engine layout)" in lines


def test_recipe_without_a_workload_exits_2_naming_the_k_filter():
    done = _cli("--recipe", "autocast-bf16", "--list")
    assert done.returncode == 2
    assert "the embedded matrix's rows of one recipe are -k recipe=autocast-bf16" in done.stderr
