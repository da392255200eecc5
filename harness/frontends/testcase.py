"""``harness.DistributedTestCase``: unittest-style distributed test classes on the warm rank pool.

Why: most distributed tests people already have are ``MultiProcessTestCase`` classes (methods that
run on every rank with ``self.rank``/``self.world_size``, call ``dist.init_process_group`` themselves,
expand matrices with ``parameterized``, compare with expecttest). Each of their tests spawns fresh
ranks, seconds per test. Changing the base class to this one runs the same methods on the warm
pool, with the harness's outcomes (any rank failing fails the test, the rank named; an asymmetric
skip fails; deadlines dump every rank's stack and the next test runs on fresh ranks).

This module is imported on both sides (the controller collects the class, the ranks instantiate
it), so it holds only the class (its configuration and where to find it are read by
``testcase_config``); it imports neither torch nor pytest. What runs where:

* controller: :meth:`DistributedTestCase.run` hands the test to ``testcase_controller`` (the
  pytest plugin's pool under pytest, a pool of its own under ``python -m unittest``);
* ranks: ``testcase_rank.run_test_method`` instantiates the class with the method name, sets the
  per-rank attributes and runs ``setUp``/method/``tearDown`` through unittest's own ``run``.
"""

from __future__ import annotations

import unittest
from collections.abc import Callable
from typing import Any, TypeVar

from harness.frontends import testcase_controller
from harness.frontends.tensor_asserts import TensorAssertions
from harness.frontends.testcase_config import MIN_GPUS_ATTR
from harness.rank import context

DEFAULT_WORLD_SIZE = 4
"""As ``MultiProcessTestCase``: a class migrated without a ``world_size`` keeps its 4 ranks."""
DEFAULT_SEED = 1234
"""As ``MultiProcessTestCase`` (``common_utils.SEED``): expected values drawn from the RNG stay valid."""

_T = TypeVar("_T")


class DistributedTestCase(TensorAssertions):
    """A ``unittest.TestCase`` whose every test method runs on every rank of the warm pool.

    Class attributes (a ``@property`` works too, as ``MultiProcessTestCase`` subclasses write
    ``world_size``)::

        class TestAllReduce(harness.DistributedTestCase):
            world_size = 2          # ranks (default 4, as MultiProcessTestCase)
            backend = "gloo"        # or "nccl": one GPU per rank, skipped at collection without them
            deadline = None         # seconds for the whole test on the ranks (default --dist-deadline)

            def test_sum(self):
                dist.init_process_group("gloo", store=dist.FileStore(self.file_name, self.world_size),
                                        rank=self.rank, world_size=self.world_size)  # absorbed
                t = torch.tensor([float(self.rank)])
                dist.all_reduce(t)
                self.assertEqual(t.item(), 1.0)

    Inside the ranks each test gets ``self.rank``, ``self.world_size``, ``self.device``
    (``cuda:rank`` for NCCL), ``self.process_group`` (the default group) and ``self.file_name`` (a
    fresh file per test, the same on every rank, for a ``FileStore``); every rank seeds torch,
    ``random`` and numpy with ``seed`` before ``setUp``. ``setUp`` and ``tearDown`` run on every
    rank; ``tearDown`` starts once every rank has finished the test method, so it may remove what
    peers still use. ``dist.init_process_group``/``destroy_process_group`` called by the test are
    absorbed by the warm group (a world size or rank that does not match is an error naming both).
    ``setUpClass``/``tearDownClass`` run once, in the controller, as under ``MultiProcessTestCase``.

    ``assertEqual``/``assertNotEqual`` compare tensors as torch's ``common_utils.TestCase`` does
    (``MultiProcessTestCase``'s base), and other arguments as unittest does
    (:mod:`harness.frontends.tensor_asserts`); mixing torch's test case in after this class gives torch's.
    """

    world_size: int = DEFAULT_WORLD_SIZE
    """Number of ranks of every test of the class (an int >= 1)."""
    backend: str = "gloo"
    """``"gloo"`` (CPU) or ``"nccl"`` (one GPU per rank)."""
    deadline: float | None = None
    """Wall-clock limit of one test on the ranks, in seconds; ``None``: ``--dist-deadline`` (120)."""
    collective_timeout: float | None = None
    """Timeout of one collective; ``None``: half the deadline."""
    seed: int | None = DEFAULT_SEED
    """Every rank seeds torch, ``random`` and numpy with it before ``setUp``; ``None``: left alone."""

    # Set inside the ranks, before setUp (not on the controller).
    rank: int
    device: Any
    process_group: Any
    file_name: str

    def run(self, result: unittest.TestResult | None = None) -> unittest.TestResult | None:
        """In a rank: unittest's own run (setUp, the method, tearDown, cleanups). Elsewhere: run
        this test on every rank of the pool and report the one verdict to ``result``."""
        if context.in_rank():
            return super().run(result)
        return testcase_controller.run(self, result)

    # -- MultiProcessTestCase compatibility ----------------------------------------------------
    def _spawn_processes(self) -> None:
        """Nothing to do: the warm pool's ranks already run this test. Kept so that a migrated
        ``setUp`` calling ``self._spawn_processes()`` works unchanged."""

    def _start_processes(self, proc: Any) -> None:
        """Nothing to do (see :meth:`_spawn_processes`)."""

    def _handle_test_skip(self, msg: str) -> None:
        """torch's ``skip_if_lt_x_gpu`` calls this in the ranks: skip (on every rank alike)."""
        raise unittest.SkipTest(msg)

    # -- expecttest ----------------------------------------------------------------------------
    def assertExpectedInline(self, actual: str, expect: str, skip: int = 0) -> None:
        """expecttest's ``assertExpectedInline``: with ``EXPECTTEST_ACCEPT=1`` rank 0 alone
        rewrites the literal in the source (the others accept without writing)."""
        expecttest = _import_expecttest()
        expecttest.assert_expected_inline(
            actual,
            expect,
            skip=skip + 1,
            expect_filters=getattr(self, "_expect_filters", None),
            debug_id=self.id(),
            assert_eq=self.assertMultiLineEqual,
        )

    def assertExpectedRaisesInline(
        self,
        exc_type: type[BaseException],
        callable: Callable[..., Any],
        expect: str,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        """expecttest's ``assertExpectedRaisesInline``: ``str()`` of the raised exception."""
        try:
            callable(*args, **kwargs)
        except exc_type as exc:
            self.assertExpectedInline(str(exc), expect, skip=1)
            return
        self.fail(f"{getattr(callable, '__name__', callable)!s} did not raise {exc_type.__name__}")


def _import_expecttest() -> Any:
    try:
        import expecttest
    except ImportError as exc:
        raise ImportError(
            "assertExpectedInline needs the expecttest package: pip install expecttest"
        ) from exc
    return expecttest


def skip_if_lt_x_gpu(count: int) -> Callable[[_T], _T]:
    """Skip a test method (or every test of a class) on machines with fewer than ``count`` CUDA
    GPUs, decided at collection: no rank is started for it. Under pytest such a test carries the
    ``gpu`` marker (``make test-gpu``, strict mode ``--require-gpus``).

    torch's own ``skip_if_lt_x_gpu`` also works, but decides inside the ranks (after starting them).
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(
            f"skip_if_lt_x_gpu(count) needs an int >= 1, got {count!r}; e.g. skip_if_lt_x_gpu(2)"
        )

    def mark(obj: _T) -> _T:
        setattr(obj, MIN_GPUS_ATTR, count)
        return obj

    return mark
