"""A test class written for PyTorch's ``MultiProcessTestCase``, run on the warm pool by changing only
its base class: the ``Base`` import below was
``from torch.testing._internal.common_distributed import MultiProcessTestCase as Base``
(``make bench`` runs this file with both imports and prints the per-test times).

Everything else is ``MultiProcessTestCase`` style: ``world_size`` as a property, ``setUp`` calling
``_spawn_processes()``, a ``FileStore`` on ``self.file_name`` handed to ``dist.init_process_group``
in each test, ``destroy_process_group()`` at the end, ``tearDown`` removing the store file,
``parameterized.expand`` and expecttest's ``assertExpectedInline``.
"""

import os

import torch
import torch.distributed as dist
from parameterized import parameterized

from harness import DistributedTestCase as Base  # the line that changed


class TestCollectivesMPCStyle(Base):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def tearDown(self):
        super().tearDown()
        try:
            os.remove(self.file_name)
        except OSError:
            pass

    def _init(self):
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)

    def test_all_reduce_sums_ranks(self):
        self._init()
        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        self.assertEqual(t.item(), 3.0)
        dist.destroy_process_group()

    @parameterized.expand([("rank0", 0), ("rank1", 1)])
    def test_broadcast_from(self, _name, src):
        self._init()
        t = torch.tensor([float(self.rank * 10)])
        dist.broadcast(t, src=src)
        self.assertEqual(t.item(), src * 10.0)
        dist.destroy_process_group()

    def test_all_gather_matches_expected_text(self):
        self._init()
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, {"rank": self.rank})
        self.assertExpectedInline(str(gathered), """[{'rank': 0}, {'rank': 1}]""")
        dist.destroy_process_group()

    def test_store_file_is_shared_by_every_rank(self):
        store = dist.FileStore(self.file_name, self.world_size)
        store.set(f"from{self.rank}", str(self.rank))
        peer = 1 - self.rank
        self.assertEqual(store.get(f"from{peer}"), str(peer).encode())
