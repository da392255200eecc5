"""``DistributedTestCase`` tests skipped at collection, run as an inner pytest session by
``test_testcase_outcomes.py`` (not collected), which watches that the session starts no process.
Nothing here imports torch's test utilities: importing them starts a subprocess."""

from __future__ import annotations

import unittest

import harness


class TestCollectionSkips(harness.DistributedTestCase):
    world_size = 2

    @harness.skip_if_lt_x_gpu(64)
    def test_needs_64_gpus(self):
        raise AssertionError("never runs: skipped at collection")

    @unittest.skip("skipped by unittest")
    def test_unittest_skip(self):
        raise AssertionError("never runs: skipped at collection")


@harness.skip_if_lt_x_gpu(64)
class TestWholeClassNeeds64Gpus(harness.DistributedTestCase):
    world_size = 2

    def test_one(self):
        raise AssertionError("never runs: skipped at collection")


class TestNcclNeedsGpus(harness.DistributedTestCase):
    world_size = 2
    backend = "nccl"

    def test_nccl(self):
        pass  # runs only on a machine with 2 GPUs
