"""``harness.DistributedTestCase`` on the warm pool: what a test method finds on its rank, what
``setUp``/``tearDown`` see, ``init_process_group``/``destroy_process_group`` absorbed, and
``parameterized`` classes. Every test here passes; failures and skips are in
``test_testcase_outcomes.py``."""

from __future__ import annotations

import os
import random
import time

import pytest
import torch
import torch.distributed as dist
from parameterized import parameterized_class

import harness
from harness.controller.pool import CaseSpec, RankPool
from harness.frontends import testcase_config
from harness.frontends.testcase_controller import TARGET, case_arguments, store_file
from harness.outcome import judge
from harness.spec import DistConfig


class TestWhatARankFinds(harness.DistributedTestCase):
    world_size = 2

    def setUp(self):
        super().setUp()
        self.set_up_on = (self.rank, dist.get_rank())

    def test_rank_world_size_device_and_group_are_this_ranks(self):
        self.assertEqual(self.rank, dist.get_rank())
        self.assertEqual(self.world_size, dist.get_world_size())
        self.assertEqual(self.world_size, 2)
        self.assertEqual(self.device, torch.device("cpu"))
        self.assertIs(self.process_group, dist.group.WORLD)

    def test_set_up_ran_on_this_rank_before_the_method(self):
        self.assertEqual(self.set_up_on, (self.rank, self.rank))

    def test_file_name_is_one_fresh_file_for_every_rank(self):
        names = [None] * self.world_size
        dist.all_gather_object(names, self.file_name)
        self.assertEqual(names, [self.file_name] * self.world_size)
        self.assertTrue(os.path.exists(self.file_name))

    def test_every_rank_starts_with_the_seeded_rng(self):
        drawn = (torch.rand(1).item(), random.random())
        torch.manual_seed(harness.DistributedTestCase.seed)
        random.seed(harness.DistributedTestCase.seed)
        self.assertEqual(drawn, (torch.rand(1).item(), random.random()))
        torch.rand(100)  # what this test draws must not reach the next one


class TestAPropertyOfTheClassWins(harness.DistributedTestCase):
    world_size = 2

    @property
    def device(self):  # test bases of other frameworks compute some of these themselves
        return torch.device("meta")

    def test_the_harness_leaves_the_property_alone(self):
        self.assertEqual(self.device, torch.device("meta"))
        self.assertEqual(self.rank, dist.get_rank())


class TestTearDownWaitsForEveryRank(harness.DistributedTestCase):
    world_size = 2

    def tearDown(self):
        harness.current().store.set(f"torn-down-rank{self.rank}", "1")
        super().tearDown()

    def test_tear_down_starts_after_every_rank_finished_the_method(self):
        if self.rank == 1:
            time.sleep(0.5)  # rank 0 is done with the method by now
            self.assertFalse(harness.current().store.check(["torn-down-rank0"]))


class TestGroupCallsAreAbsorbed(harness.DistributedTestCase):
    world_size = 2

    def test_init_process_group_of_this_world_returns_the_warm_group(self):
        dist.init_process_group(
            "gloo", init_method=f"file://{self.file_name}", rank=self.rank, world_size=self.world_size
        )
        dist.init_process_group(backend="gloo")  # a second init, as after destroy_process_group()
        self.assertIs(dist.group.WORLD, self.process_group)

    def test_destroy_process_group_leaves_the_warm_group_usable(self):
        dist.destroy_process_group()
        self.assertTrue(dist.is_initialized())
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2.0)

    def test_destroying_a_group_of_the_test_is_real(self):
        group = dist.new_group([0, 1])
        dist.destroy_process_group(group)
        with self.assertRaisesRegex(ValueError, "is not registered"):
            dist.get_rank(group)

    def test_another_world_size_is_an_error_naming_both(self):
        with self.assertRaisesRegex(
            ValueError,
            r"calls dist.init_process_group\(world_size=4\) but TestGroupCallsAreAbsorbed.world_size is 2: .*"
            r"set world_size = 4 on the class",
        ):
            dist.init_process_group("gloo", rank=self.rank, world_size=4)

    def test_another_backend_is_an_error_naming_both(self):
        with self.assertRaisesRegex(
            ValueError,
            r"backend='nccl'\) but TestGroupCallsAreAbsorbed.backend is 'gloo'; set backend = 'nccl'",
        ):
            dist.init_process_group("nccl", rank=self.rank, world_size=2)

    def test_another_rank_is_an_error(self):
        with self.assertRaisesRegex(
            ValueError, rf"init_process_group\(rank=7\) on rank {self.rank}; pass rank"
        ):
            dist.init_process_group("gloo", rank=7, world_size=2)


def torchs_group_functions():
    """True where ``init_process_group``/``destroy_process_group`` are torch's own, unpatched."""
    from torch.distributed import distributed_c10d as c10d

    return all(
        getattr(module, name).__module__ == "torch.distributed.distributed_c10d"
        for module in (dist, c10d)
        for name in ("init_process_group", "destroy_process_group")
    )


def test_group_calls_are_absorbed_only_while_a_test_method_runs():
    pool = RankPool()
    try:
        config = DistConfig(world_size=2)
        test = TestGroupCallsAreAbsorbed("test_destroy_process_group_leaves_the_warm_group_usable")
        with store_file() as file_name:
            args, kwargs = case_arguments(test, file_name, 30.0)
            spec = CaseSpec(target=TARGET, config=config, args=args, kwargs=kwargs, deadline_s=60.0)
            assert judge(pool.run(spec), world_size=2).outcome == "passed"
        after = CaseSpec(target=f"{__name__}:torchs_group_functions", config=config, deadline_s=60.0)
        assert judge(pool.run(after), world_size=2).values == [True, True]
    finally:
        pool.close()


@parameterized_class(("world_size", "expected"), [(1, [0]), (3, [0, 1, 2])])
class TestParameterizedClass(harness.DistributedTestCase):
    world_size = 2
    expected: list = []

    def test_each_class_runs_in_its_world(self):
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, self.rank)
        self.assertEqual(ranks, self.expected)


@pytest.mark.parametrize("attribute", ["world_size", "backend", "deadline"])
def test_a_bad_class_attribute_is_a_value_error_naming_it(attribute):
    bad = {"world_size": 0, "backend": "mpi", "deadline": -1}[attribute]
    cls = type("TestBad", (harness.DistributedTestCase,), {attribute: bad, "test_x": lambda self: None})
    with pytest.raises(ValueError, match=rf"invalid TestBad \(a harness.DistributedTestCase\): .*{bad!r}.*"):
        testcase_config.case_config(cls("test_x"))


def test_skip_if_lt_x_gpu_refuses_a_count_that_is_not_a_positive_int():
    with pytest.raises(ValueError, match=r"skip_if_lt_x_gpu\(count\) needs an int >= 1, got 0; e.g."):
        harness.skip_if_lt_x_gpu(0)
