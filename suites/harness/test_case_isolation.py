"""A warm rank carries no state bound to a destroyed process group into a later case.

DTensor caches its sharding decisions keyed by device-mesh equality, which ignores the mesh's
process groups; a later case on equal ranks could get back a mesh whose group the pool destroyed
when it rebuilt the default group ("Could not resolve the process group registered under the name
3", as seen under xdist on a GPU machine, where every CPU mesh gets a group of its own).
"""

from __future__ import annotations

import pytest

from harness.controller.pool import CaseSpec, RankPool
from harness.outcome import judge
from harness.spec import DistConfig


def dtensor_on_a_group_of_its_own(extra_groups):
    """Make ``extra_groups`` groups over every rank, put a DTensor on a mesh over the last one, and
    gather it (``full_tensor``) after an op whose sharding DTensor caches."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, distribute_tensor

    groups = [dist.new_group(list(range(dist.get_world_size()))) for _ in range(extra_groups)]
    mesh = DeviceMesh.from_group(groups[-1], "cpu")
    t = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)])
    return ((t * 2) + 1).full_tensor().sum().item()


@pytest.fixture
def pool():
    pool = RankPool()
    yield pool
    pool.close()


def run(pool, world_size, extra_groups):
    spec = CaseSpec(
        target=f"{__name__}:dtensor_on_a_group_of_its_own",
        config=DistConfig(world_size=world_size),
        args=(extra_groups,),
        deadline_s=60.0,
        collective_timeout_s=30.0,
    )
    return judge(pool.run(spec), world_size=world_size)


def test_dtensor_after_the_group_was_rebuilt_uses_the_new_group(pool):
    assert run(pool, 2, extra_groups=3).values == [64.0, 64.0]
    assert run(pool, 1, extra_groups=1).values == [64.0]  # the world changes: groups are rebuilt
    verdict = run(pool, 2, extra_groups=1)
    assert verdict.outcome == "passed", verdict.message
    assert verdict.values == [64.0, 64.0]
