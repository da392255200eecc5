"""Fixtures for the scaler suites."""

import pytest
import torch.distributed as dist


@pytest.fixture
def world_of_one():
    """A gloo default process group of one rank in this process, torn down after the test.

    Enough for the sharded scaler's single-process behaviour (its collectives are real but
    trivial); the multi-rank behaviour is tested on the harness's ranks.
    """
    if dist.is_initialized():
        pytest.fail("a default process group is already initialised in the test process")
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()
