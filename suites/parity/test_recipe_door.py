"""A user declares the recipe they train with through ``parity_test``: the workload's own
(``Workload(recipe=...)``) or the decorator's ``declared=Declared(recipe=...)``, which replaces it; each runs under engine
layouts that only a declared recipe gets (NO_SHARD, CPU offload)."""

from harness.parity import Declared, parity_test


@parity_test(
    "fixtures.recipe_workloads:resmlp_bf16_reduce32",
    k="reduce32 and fsdp1 and no_shard and orig and sgd",
)
def test_the_workloads_own_recipe_trains_like_its_twin(parity):
    assert parity.result.config.recipe_name == "bf16-reduce32"
    assert parity.passed and parity.result.closeness == "bitwise", parity.explanation


@parity_test(
    "fixtures.recipe_workloads:resmlp_bf16_reduce32",
    declared=Declared(recipe="autocast-fp16"),
    k="autocast and fsdp2 and offload and sgd and keep",
)
def test_the_decorators_recipe_replaces_the_workloads_own(parity):
    assert parity.result.config.recipe_name == "autocast-fp16"
    assert "torch.autocast(fp16)" in parity.result.candidate
    assert parity.passed and parity.result.closeness == "bitwise", parity.explanation
