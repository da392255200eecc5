"""A desync is named as a desync: before ``gather.full_tensors`` runs its one big all-gather, the
ranks agree on a fingerprint of its layout, and when the layouts differ every rank raises the same
one-line error naming each rank's layout, instead of gloo aborting one rank mid-collective."""

import pytest

from harness import RankFailure


def _gather_with_shape(rows_on_rank_1: int) -> str:
    """Every rank gathers a (5, 3) DTensor sharded on dim 0; rank 1 states ``rows_on_rank_1``
    global rows instead (a shape inferred from its local shard, as the FSDP2 bug did)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard

    from harness.parity.ranks.sides.full import gather

    mesh = gather.mesh("cpu", (dist.get_world_size(),), None)
    rows = 5 if dist.get_rank() == 0 else rows_on_rank_1
    local = torch.ones(3 if dist.get_rank() == 0 else 2, 3)
    value = DTensor.from_local(local, mesh, (Shard(0),), run_check=False, shape=(rows, 3), stride=(3, 1))
    try:
        full = gather.full_tensors({"head.weight": value}, torch.device("cpu"))
    except gather.CollectiveMismatch as error:
        return str(error)
    return f"gathered {tuple(full['head.weight'].shape)}"


def test_equal_layouts_gather(ranks):
    assert ranks.run(_gather_with_shape, 5, world_size=2) == ["gathered (5, 3)"] * 2


def test_layouts_that_differ_are_named_on_every_rank(ranks):
    try:
        messages = ranks.run(_gather_with_shape, 4, world_size=2)
    except RankFailure as failure:  # the unguarded gather: gloo aborts a rank
        pytest.fail(f"the ranks did not name the desync:\n{str(failure)[:2000]}")
    assert messages[0] == messages[1], messages
    assert messages[0].startswith("the ranks ran different collectives: rank 0 in gather.full_tensors"), (
        messages[0]
    )
    assert "head.weight (5, 3)" in messages[0] and "head.weight (4, 3)" in messages[0], messages[0]


def _gather_dtypes(rank_1_dtype: str) -> tuple[str, bool]:
    """Every rank gathers a float32 DTensor and a second one, float32 on rank 0 and
    ``rank_1_dtype`` on rank 1 (holding 1 + 2**-40 there, which float32 rounds to 1); the dtype
    gathered back and whether rank 1's values came back exactly."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard

    from harness.parity.ranks.sides.full import gather

    mesh = gather.mesh("cpu", (dist.get_world_size(),), None)
    rank_1 = dist.get_rank() == 1
    dtype = getattr(torch, rank_1_dtype) if rank_1 else torch.float32
    fine = 1.0 + 2**-40
    values = {
        "a": DTensor.from_local(torch.full((2, 2), 1.0 + 2**-20), mesh, (Shard(0),), run_check=False),
        "b": DTensor.from_local(
            torch.full((2,), fine if rank_1 else 3.0, dtype=dtype), mesh, (Shard(0),), run_check=False
        ),
    }
    full = gather.full_tensors(values, torch.device("cpu"))
    assert bool((full["a"] == 1.0 + 2**-20).all())
    want = torch.tensor(fine, dtype=dtype) if rank_1 else torch.tensor(fine).float()
    return str(full["b"].dtype), bool((full["b"][2:] == want).all())


def test_float32_tensors_travel_in_float32_exactly(ranks):
    assert ranks.run(_gather_dtypes, "float32", world_size=2) == [("torch.float32", True)] * 2


def test_ranks_whose_dtypes_differ_gather_in_float64_exactly(ranks):
    got = ranks.run(_gather_dtypes, "float64", world_size=2)
    assert got == [("torch.float32", True), ("torch.float64", True)], got


def test_the_carrier_is_float64_unless_every_rank_proposes_float32(ranks):
    assert ranks.run(_agreed_carrier, world_size=2) == ["torch.float64", "torch.float64"]


def _agreed_carrier() -> str:
    import torch
    import torch.distributed as dist

    from harness.parity.ranks.sides.full import gather

    proposed = torch.float32 if dist.get_rank() == 0 else torch.float64
    return str(gather.agree_on_layout([], 0, dist.group.WORLD, torch.device("cpu"), carrier=proposed))
