"""One ``DistributedTestCase`` test inside a rank (rank side; the pool sends it as an ordinary case).

Why a case function and not a protocol message: the pool already runs ``module:function`` on every
rank with deadlines, stacks and recovery; :func:`run_test_method` is such a function. It

* imports the class by name (``testcase_config.locate`` chose the name on the controller) and instantiates
  it with the method name, as unittest does; sets ``rank``, ``world_size``, ``device``,
  ``process_group`` and ``file_name``; seeds the RNGs as ``MultiProcessTestCase`` does;
* runs it with unittest's own ``TestCase.run`` (skips, ``expectedFailure``, ``subTest``, cleanups),
  while ``dist.init_process_group``/``destroy_process_group`` are absorbed by the warm group
  (``group_calls.absorbed``) and expecttest writes sources from rank 0 only;
* makes ``tearDown`` wait until every rank has finished the method (as under
  ``MultiProcessTestCase``, where ``tearDown`` runs after the ranks are joined), so a ``tearDown``
  may remove what peers still use. A rank whose ``setUp`` or method failed does not wait: it says
  so, leaves the group (peers blocked in a collective with it fail at once instead of at the
  collective timeout) and reports, so the pool's rules for a failed rank apply (peers still
  running after ``peer_grace_s`` are stopped, with their stacks);
* turns unittest's result into the case's status (``execute.ReportedOutcome``), with unittest's own
  failure text.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import random
import sys
import unittest
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from harness.frontends.testcase import DistributedTestCase
from harness.rank import context, group_calls, subtests
from harness.rank.execute import ReportedOutcome, headline
from harness.torch_private import c10d

__unittest = True  # unittest leaves this module's frames (the wrappers below) out of its tracebacks


def run_test_method(
    module_name: str, class_path: str, method_name: str, *, file_name: str, finish_timeout_s: float
) -> None:
    """Run ``module_name:class_path.method_name`` on this rank; raise ``ReportedOutcome`` unless
    it passed. ``finish_timeout_s`` bounds the wait for the other ranks before ``tearDown``."""
    ctx = context.current()
    cls = _find_class(module_name, class_path)
    test = cls(method_name)
    _bind(test, ctx, file_name)
    _wait_before_tear_down(test, ctx, timeout_s=finish_timeout_s)
    result = _RankResult()
    with group_calls.absorbed(test_id=test.id(), class_name=cls.__name__, ctx=ctx):
        with _expecttest_written_by_rank0(ctx.rank):
            test.run(result)
    result.raise_outcome(test)


def _find_class(module_name: str, class_path: str) -> type[DistributedTestCase]:
    obj: Any = importlib.import_module(module_name)
    for part in class_path.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, DistributedTestCase)):
        raise TypeError(f"{module_name}:{class_path} is not a harness.DistributedTestCase subclass")
    return obj


def _bind(test: DistributedTestCase, ctx: context.RankContext, file_name: str) -> None:
    import torch.distributed as dist

    declared = test.world_size  # a class attribute, or a property MultiProcessTestCase-style
    if declared != ctx.world_size:
        raise RuntimeError(
            f"{type(test).__name__}.world_size is {declared!r} in rank {ctx.rank} but the controller "
            f"started {ctx.world_size} ranks; world_size must not depend on where it is read"
        )
    attributes = {
        "world_size": ctx.world_size,
        "rank": ctx.rank,
        "device": ctx.device,
        "process_group": dist.group.WORLD,
        "file_name": file_name,
    }
    for name, value in attributes.items():
        if not isinstance(getattr(type(test), name, None), property):  # a property of the class wins
            setattr(test, name, value)
    if test.seed is not None:
        _seed(test.seed)


def _seed(seed: int) -> None:
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed)


def _wait_before_tear_down(test: DistributedTestCase, ctx: context.RankContext, *, timeout_s: float) -> None:
    """Wrap this instance's ``setUp``, method and ``tearDown`` so that every rank says in the case's
    store, exactly once, when it is done with the method (``setUp`` failed, or ``tearDown`` is
    next), and the ``tearDown`` of a rank that passed starts only once every rank has said so."""
    method_name = test._testMethodName
    set_up, method, tear_down = test.setUp, getattr(test, method_name), test.tearDown
    raised = False

    def finished(ok: bool) -> None:
        if ctx.world_size == 1:
            return
        ctx.store.set(f"method-done/rank{ctx.rank}", b"1" if ok else b"0")
        if not ok:  # report now, without waiting: the pool stops peers that stay stuck
            test.process_group = None  # a live reference would keep the group's connections open
            subtests.leave_group()  # peers blocked in a collective with us get an error now
            return
        keys = [f"method-done/rank{r}" for r in range(ctx.world_size)]
        try:
            ctx.store.wait(keys, timedelta(seconds=timeout_s))
        except Exception as exc:  # a store timeout; say what we waited for
            missing = [r for r, key in enumerate(keys) if not ctx.store.check([key])]
            raise TimeoutError(
                f"timed out after {timeout_s:g}s waiting for ranks {missing} to finish {method_name} "
                "(tearDown starts once every rank has finished the test method)"
            ) from exc

    @functools.wraps(set_up)
    def set_up_then_report_failure() -> None:
        try:
            set_up()
        except BaseException:
            with contextlib.suppress(Exception):  # the setUp failure is the one to report
                finished(ok=False)
            raise

    @functools.wraps(method)
    def method_noting_failure(*args: Any, **kwargs: Any) -> Any:
        nonlocal raised
        try:
            return method(*args, **kwargs)
        except BaseException:
            raised = True
            raise

    @functools.wraps(tear_down)
    def tear_down_after_every_rank() -> None:
        outcome = getattr(test, "_outcome", None)
        try:
            finished(ok=not raised and getattr(outcome, "success", True))
        finally:
            tear_down()

    test.setUp = set_up_then_report_failure  # type: ignore[method-assign]
    setattr(test, method_name, method_noting_failure)
    test.tearDown = tear_down_after_every_rank  # type: ignore[method-assign]


@contextlib.contextmanager
def _expecttest_written_by_rank0(rank: int) -> Iterator[None]:
    """With ``EXPECTTEST_ACCEPT`` set, ranks other than 0 accept a new value without rewriting the
    source: every rank rewriting the same file would apply the edit once per rank (each with its
    own idea of the line numbers)."""
    if rank == 0 or not os.environ.get("EXPECTTEST_ACCEPT"):
        yield
        return
    try:
        import expecttest
    except ImportError:
        yield
        return
    write = getattr(expecttest, "_accept_output", None)
    if write is None:
        raise RuntimeError(
            f"this expecttest ({getattr(expecttest, '__version__', '?')}) has no _accept_output; "
            "EXPECTTEST_ACCEPT=1 cannot be limited to rank 0: unset it, or pin expecttest<=0.3"
        )
    expecttest._accept_output = _accept_without_writing
    try:
        yield
    finally:
        expecttest._accept_output = write


def _accept_without_writing(pos: Any, actual: str, debug_suffix: str) -> None:
    """expecttest's ``_accept_output`` on ranks other than 0: rank 0 rewrites the source."""


def _torch_skip_reason(exc: BaseException | None) -> str | None:
    """torch's distributed skip decorators end a rank with ``sys.exit(code)``; the code's message
    when ``exc`` is such an exit (``MultiProcessTestCase`` turns these exit codes into skips)."""
    if not isinstance(exc, SystemExit):
        return None
    return c10d.test_skip_message(exc.code)


class _RankResult(unittest.TestResult):
    """unittest's result of one test on this rank, with torch's skip exits taken as skips, and the
    headline of the first failure (unittest keeps only formatted tracebacks)."""

    def __init__(self) -> None:
        super().__init__()
        self.first_headline = ""
        self.expected_headline = ""

    def _note(self, err: Any) -> None:
        if not self.first_headline:
            self.first_headline = headline(err[1])

    def addError(self, test: Any, err: Any) -> None:
        reason = _torch_skip_reason(err[1])
        if reason is not None:
            self.addSkip(test, reason)
        else:
            self._note(err)
            super().addError(test, err)

    def addFailure(self, test: Any, err: Any) -> None:
        self._note(err)
        super().addFailure(test, err)

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
        reason = _torch_skip_reason(err[1]) if err is not None else None
        if reason is not None:
            self.addSkip(subtest, reason)
        else:
            if err is not None:
                self._note(err)
            super().addSubTest(test, subtest, err)

    def addExpectedFailure(self, test: Any, err: Any) -> None:
        self.expected_headline = self.expected_headline or headline(err[1])
        super().addExpectedFailure(test, err)

    def raise_outcome(self, test: unittest.TestCase) -> None:
        """Raise ``ReportedOutcome`` for a test that did not pass; return if it passed."""
        bad = self.errors + self.failures
        if bad:
            if len(bad) == 1 and bad[0][0] is test:
                text = bad[0][1]
            else:  # subtests (or a test and its subtests): each part with its own traceback
                parts = [f"---- {case} ----\n{trace.rstrip()}" for case, trace in bad]
                count = f"{len(bad)} part{'s' if len(bad) > 1 else ''}"
                text = "\n".join([f"{count} of {test.id()} failed:", *parts])
            raise ReportedOutcome("failed", text, self.first_headline)
        if self.unexpectedSuccesses:
            raise ReportedOutcome(
                "failed", f"unexpected success: {test.id()} is marked @unittest.expectedFailure but passed"
            )
        whole_skip = [reason for case, reason in self.skipped if case is test]
        if whole_skip:
            raise ReportedOutcome("skipped", whole_skip[0])
        if self.expectedFailures:
            raise ReportedOutcome("xfailed", f"expected failure: {self.expected_headline}")
