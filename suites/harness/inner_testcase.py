"""``DistributedTestCase`` classes that fail, skip or hang, run as an inner pytest session by
``test_testcase_outcomes.py`` (not collected: the name does not start with ``test_``). Also run
with ``python -m unittest inner_testcase`` and as a script (``unittest.main()`` below).

Each class holds one behaviour; the outer tests read each test's outcome from the session's report.
"""

from __future__ import annotations

import os
import time
import unittest

import torch
import torch.distributed as dist
from parameterized import parameterized
from torch.testing._internal.common_distributed import skip_if_lt_x_gpu as torch_skip_if_lt_x_gpu
from torch.testing._internal.common_distributed import skip_if_no_gpu as torch_skip_if_no_gpu
from torch.testing._internal.common_utils import TestCase as TorchTestCase

import harness


def _out(name: str) -> str:
    return os.path.join(os.environ["SHARDSCALE_SELFTEST_DIR"], name)


class TestOneRankFails(harness.DistributedTestCase):
    world_size = 2

    def test_rank1_fails(self):
        if self.rank == 1:
            self.fail("rank 1 disagrees")


class TestMultiLineMessageOnRank1(harness.DistributedTestCase):
    world_size = 2

    def test_rank1_raises_a_multi_line_message(self):
        if self.rank == 1:
            raise NotImplementedError(
                "Could not run 'aten::eq.Tensor' with arguments from the 'SparseCPU' backend.\n\n"
                "PythonDispatcher: registered at PythonFallbackKernel.cpp:196 [backend fallback]"
            )


class TestAsymmetricSkip(harness.DistributedTestCase):
    world_size = 2

    def test_rank0_skips(self):
        if self.rank == 0:
            self.skipTest("only rank 0 wants to skip")


class TestEveryRankSkips(harness.DistributedTestCase):
    world_size = 2

    def test_every_rank_skips(self):
        self.skipTest(f"nothing to do on {self.world_size} ranks")

    @torch_skip_if_lt_x_gpu(2)
    def test_torch_skip_if_lt_x_gpu(self):
        pass  # runs (and passes) with 2 GPUs

    @torch_skip_if_no_gpu
    def test_torch_skip_if_no_gpu(self):
        pass  # runs (and passes) with a GPU per rank


class TestSetUpFailsOnRank1(harness.DistributedTestCase):
    world_size = 2
    collective_timeout = 60.0
    deadline = 90.0

    def setUp(self):
        super().setUp()
        if self.rank == 1:
            raise RuntimeError("rank 1 cannot set up")

    def test_all_reduce_after_set_up(self):
        dist.all_reduce(torch.ones(1))


class TestTearDownRunsOnEveryRank(harness.DistributedTestCase):
    world_size = 2

    def tearDown(self):
        with open(
            _out(f"tear-down-{os.environ.get('SHARDSCALE_SELFTEST_RUN', 'pytest')}-rank{self.rank}"), "w"
        ):
            pass
        super().tearDown()

    def test_passes(self):
        pass


class TestHangsOnRank1(harness.DistributedTestCase):
    world_size = 2
    deadline = 4.0

    def test_rank1_hangs(self):
        if self.rank == 1:
            time.sleep(60)


class TestAfterTheHang(harness.DistributedTestCase):
    world_size = 2

    def test_runs_on_fresh_ranks(self):
        t = torch.ones(1)
        dist.all_reduce(t)
        self.assertEqual(t.item(), 2.0)


class TestInitWithAnotherWorldSize(harness.DistributedTestCase):
    world_size = 2

    def test_init_with_four(self):
        dist.init_process_group("gloo", rank=self.rank, world_size=4)


class TestBadWorldSize(harness.DistributedTestCase):
    world_size = 0

    def test_never_runs(self):
        pass


class TestUnittestOutcomes(harness.DistributedTestCase):
    world_size = 2

    @unittest.expectedFailure
    def test_expected_failure(self):
        self.assertEqual(self.rank, -1)

    @unittest.expectedFailure
    def test_unexpected_success(self):
        pass

    def test_subtests_each_reported(self):
        for value in range(3):
            with self.subTest(value=value):
                self.assertNotEqual(value, 1, "value 1 is wrong")

    @parameterized.expand([("small", 1), ("large", 1000)])
    def test_expanded(self, _name, size):
        self.assertEqual(torch.ones(size).sum().item(), size)


class TestTensorAssertEqualWithTheBaseOnly(harness.DistributedTestCase):
    """Moved from MultiProcessTestCase by changing the base only: assertEqual still means torch's."""

    world_size = 2

    def test_tensor_assert_equal_without_torchs_test_case(self):
        t = torch.ones(3) * (self.rank + 1)
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((3,), 3.0))
        with self.assertRaisesRegex(AssertionError, "dtype"):
            self.assertEqual(t.long(), torch.full((3,), 3.0))


class TestTorchTestCaseMixedIn(harness.DistributedTestCase, TorchTestCase):
    world_size = 2

    def test_tensor_assert_equal(self):
        t = torch.ones(3) * (self.rank + 1)
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((3,), 3.0))
        with self.assertRaisesRegex(AssertionError, "Tensor-likes are not close"):
            self.assertEqual(t, torch.zeros(3))


if __name__ == "__main__":
    unittest.main()
