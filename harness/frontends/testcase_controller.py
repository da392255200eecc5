"""Run one ``DistributedTestCase`` test on the ranks and report its verdict (controller side).

Why here and not in the class: the class is imported by the ranks too, which must never import
the pool. ``DistributedTestCase.run(result)`` calls :func:`run`, which knows two callers:

* pytest (``result`` is pytest's unittest item, whose session holds the plugin's state): the test
  runs on the session's pool, like a ``@harness.distributed`` test, and the verdict becomes pytest's
  outcome (failure text, rank logs and ``reproduce:`` line included). Skips were decided at
  collection (``plugin.pytest_collection_modifyitems`` with :func:`collection_skip`);
* anything else (``python -m unittest``, ``unittest.main()``, pytest with the plugin disabled):
  the test runs on a pool of this process, started by the first such test and closed when the
  interpreter exits (``atexit``), and the verdict is reported to the unittest ``result``.

Each test gets a fresh store file (``self.file_name``), created here before the case and removed
after it, whatever the ranks did.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import sys
import tempfile
import unittest
from collections.abc import Iterator
from typing import Any

from harness.frontends.session import gpu_skip_reason
from harness.frontends.testcase_config import (
    case_config,
    locate,
    lt_x_gpu_reason,
    min_gpus,
    unittest_skip_reason,
)
from harness.outcome import RankFailure, judge

TARGET = "harness.frontends.testcase_rank:run_test_method"
DEFAULT_DEADLINE_S = 120.0
"""Deadline of a test under ``python -m unittest`` when its class sets none (pytest's
``--dist-deadline`` default)."""

_pool: Any = None  # the pool of this process outside pytest, started by the first test
__unittest = True  # unittest leaves this module's frames out of the failures it reports


def run(test: unittest.TestCase, result: Any) -> Any:
    """Run ``test`` on every rank and report the verdict (see the module docstring)."""
    state = _pytest_state(result)
    if state is not None:
        _run_under_pytest(test, result, state)
        return result
    return _run_under_unittest(test, result)


def case_arguments(test: unittest.TestCase, file_name: str, finish_timeout_s: float) -> tuple[tuple, dict]:
    """``(args, kwargs)`` of ``testcase_rank.run_test_method`` for ``test``."""
    module_name, class_path = locate(type(test))
    args = (module_name, class_path, test._testMethodName)
    return args, {"file_name": file_name, "finish_timeout_s": finish_timeout_s}


@contextlib.contextmanager
def store_file() -> Iterator[str]:
    """A fresh, empty file for the test's ``FileStore`` (``self.file_name``), removed afterwards."""
    fd, name = tempfile.mkstemp(prefix="shardscale-store-")
    os.close(fd)
    try:
        yield name
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(name)


def gpus() -> int:
    """CUDA GPUs of this machine (imports torch: only called once a test is about to run)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# -- pytest ---------------------------------------------------------------------------------------
def _pytest_state(result: Any) -> Any:
    """The plugin's session state when ``result`` is pytest's item for this test, else None."""
    plugin = sys.modules.get("harness.frontends.plugin")
    config = getattr(result, "config", None)
    if plugin is None or getattr(config, "stash", None) is None:
        return None
    return plugin.session_state(config)


def _run_under_pytest(test: unittest.TestCase, item: Any, state: Any) -> None:
    config = case_config(test)
    _, collective_s = config.timeouts(state.deadline_s)
    with store_file() as file_name:
        args, kwargs = case_arguments(test, file_name, collective_s)
        verdict, results = state.run(item, TARGET, config, args, kwargs)
    state.raise_outcome(item, verdict, results)


# -- python -m unittest ---------------------------------------------------------------------------
def _run_under_unittest(test: unittest.TestCase, result: unittest.TestResult | None) -> Any:
    stop_run = None
    if result is None:
        result = test.defaultTestResult()
        getattr(result, "startTestRun", lambda: None)()
        stop_run = getattr(result, "stopTestRun", None)
    result.startTest(test)
    try:
        reason = _skip_reason(test)
        if reason is not None:
            result.addSkip(test, reason)
            return result
        _report(test, result, *_run_on_own_pool(test, case_config(test)))
    except KeyboardInterrupt:
        raise
    except Exception:  # noqa: BLE001 - a bad class attribute or ranks that cannot start: this test's error
        result.addError(test, sys.exc_info())
    finally:
        result.stopTest(test)
        if stop_run is not None:
            stop_run()
    return result


def _skip_reason(test: unittest.TestCase) -> str | None:
    """What pytest decides at collection, decided before any rank starts: ``@unittest.skip...``,
    NCCL without a GPU per rank, ``harness.skip_if_lt_x_gpu(n)`` without n GPUs."""
    reason = unittest_skip_reason(test)
    if reason is not None:
        return reason
    config = case_config(test)
    if config.backend == "nccl" and gpus() < config.world_size:
        return gpu_skip_reason(config.world_size, gpus())
    if min_gpus(test) > gpus():
        return lt_x_gpu_reason(min_gpus(test), gpus())
    return None


def _run_on_own_pool(test: unittest.TestCase, config: Any) -> tuple[Any, list]:
    from harness.controller.pool import CaseSpec

    _, collective = config.timeouts(DEFAULT_DEADLINE_S)
    with store_file() as file_name:
        args, kwargs = case_arguments(test, file_name, collective)
        spec = CaseSpec.of(TARGET, config, args=args, kwargs=kwargs, default_deadline_s=DEFAULT_DEADLINE_S)
        results = own_pool().run(spec)
    # What the ranks printed was echoed to this process's stdout/stderr while they ran.
    return judge(results, world_size=config.world_size, include_output=False), results


def _report(test: unittest.TestCase, result: unittest.TestResult, verdict: Any, results: list) -> None:
    if verdict.outcome == "passed":
        result.addSuccess(test)
    elif verdict.outcome == "skipped":
        result.addSkip(test, verdict.message)
    elif verdict.outcome == "xfailed":
        result.addExpectedFailure(test, _exc_info(RankFailure(verdict.message)))
    else:
        result.addFailure(test, _exc_info(RankFailure(f"{verdict.message}\n{unittest_repro_command(test)}")))


def _exc_info(exc: BaseException) -> Any:
    """``sys.exc_info()`` of ``exc`` raised here: results (pytest's among them) expect a traceback;
    unittest leaves this module's frames out of its report (``__unittest``)."""
    try:
        raise exc
    except BaseException:
        return sys.exc_info()


def unittest_repro_command(test: unittest.TestCase) -> str:
    """One line that reruns just this test with unittest."""
    module_name, class_path = locate(type(test))
    name = f"{class_path}.{test._testMethodName}"
    main = sys.modules.get("__main__")
    if module_name == "__main__" and getattr(main, "__file__", None):
        command = f"{shlex.quote(sys.executable)} {shlex.quote(os.path.abspath(main.__file__))} {name}"
    else:
        command = f"{shlex.quote(sys.executable)} -m unittest {module_name}.{name}"
    return f"reproduce: cd {shlex.quote(os.getcwd())} && {command}"


def own_pool() -> Any:
    """This process's pool outside pytest (started on first use, closed at interpreter exit)."""
    global _pool
    if _pool is None:
        from harness.controller.pool import RankPool
        from harness.frontends.session import echo_rank_output

        _pool = RankPool(on_output=echo_rank_output)
        atexit.register(close_own_pool)
    return _pool


def close_own_pool() -> None:
    """Close the pool of :func:`own_pool`, saying on stderr what the ranks left running."""
    global _pool
    pool, _pool = _pool, None
    if pool is None:
        return
    outlived = pool.close()
    if outlived:
        sys.stderr.write(
            f"shardscale: {len(outlived)} process(es) started by ranks outlived the tests and were "
            f"killed: {outlived}\n"
        )
