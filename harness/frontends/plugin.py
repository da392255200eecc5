"""The pytest plugin (entry point ``shardscale``): marker, fixtures, skips, reports, cleanup.

Why it is thin: the rules live in ``outcome.py``, the processes in ``pool.py``; this module only
maps pytest's life cycle onto them. It imports the pool lazily, so a session without distributed
tests starts no process and does not import torch. Plugin state sits in ``config.stash`` and is
created only on the process that runs tests (each xdist worker owns its own pool).
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from harness.frontends.session import (  # noqa: F401 - repro_command stays importable from here
    WORKER_OUTPUT_KEY,
    SessionState,
    gpu_skip_reason,
    repro_command,
    strict_gpu_message,
)
from harness.frontends.testcase import DistributedTestCase
from harness.frontends.testcase_config import case_config, lt_x_gpu_reason, min_gpus, unittest_skip_reason
from harness.outcome import RankFailure
from harness.protocol import Placeholder
from harness.spec import MARKER, DistConfig, from_marker

_CASE_PARAM = "_shardscale_case"
_state_key = pytest.StashKey[SessionState]()
_config_key = pytest.StashKey[DistConfig]()
_setup_error_key = pytest.StashKey[str]()
"""Why a test must fail at setup instead of running (a bad marker; strict GPU mode without GPUs)."""
_gpus_needed_key = pytest.StashKey[int]()
"""How many CUDA GPUs a test needs (NCCL world size, ``skip_if_lt_x_gpu``); fewer skip it."""


def _target(func: Any) -> str:
    qualname = func.__qualname__
    if "<locals>" in qualname or func.__module__ == "__main__":
        raise ValueError(
            f"{qualname} must be defined at module level of an importable module, "
            "because ranks import it by qualified name (module:function)"
        )
    return f"{func.__module__}:{qualname}"


# -- hooks ------------------------------------------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("shardscale", "shardscale multi-process harness")
    group.addoption(
        "--dist-deadline",
        type=float,
        default=120.0,
        help="default per-test deadline of distributed tests in seconds (collective timeout: half of it)",
    )
    group.addoption("--rank-threads", type=int, default=1, help="torch intra-op threads per rank (default 1)")
    group.addoption(
        "--require-gpus",
        type=int,
        default=0,
        metavar="N",
        help="strict GPU mode for GPU runners: this machine must have N CUDA GPUs, and a test marked gpu "
        "(every NCCL test) that would be skipped for lack of GPUs fails instead (NCCL tests needing more "
        "than N GPUs still skip); default 0: off",
    )
    parser.addini(
        "shardscale_preload",
        type="linelist",
        default=[],
        help="modules the ranks' targets import, imported once by the forkserver before it forks them "
        "(e.g. harness.parity.ranks.entry: the parity engine's rank side)",
    )
    group.addoption(
        "--rank-logs",
        default=None,
        metavar="DIR",
        help="where per-rank logs of failed tests go (default: rank-logs under pytest's basetemp)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(world_size=2, backend='gloo', deadline=None, collective_timeout=None): "
        "run the test on every rank of a process group (harness)",
    )
    config.addinivalue_line("markers", "gpu: needs CUDA GPUs (selected by `make test-gpu`)")
    if config.getoption("rank_threads") < 1:
        raise pytest.UsageError(f"--rank-threads must be >= 1, got {config.getoption('rank_threads')}")
    if config.getoption("require_gpus") < 0:
        raise pytest.UsageError(
            "--require-gpus must be >= 0 (the number of CUDA GPUs this runner must have), "
            f"got {config.getoption('require_gpus')}"
        )
    if not config.getoption("dist_deadline") > 0:
        raise pytest.UsageError(
            f"--dist-deadline must be > 0 seconds, got {config.getoption('dist_deadline')}"
        )
    config.stash[_state_key] = SessionState(config)
    from harness.parity.doors import pytest_plugin

    config.pluginmanager.register(pytest_plugin, "shardscale-parity")


def session_state(config: pytest.Config) -> SessionState | None:
    """The plugin's state of this session (None where the plugin was not configured): what
    ``DistributedTestCase.run`` needs to run a test on this session's pool."""
    return config.stash.get(_state_key, None)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_state_key, None)
    if state is not None:
        state.close()


def pytest_sessionfinish(session: pytest.Session) -> None:
    session.config.stash[_state_key].close()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """(xdist controller) Keep what a worker's pool killed at the end of its session."""
    outlived = getattr(node, "workeroutput", {}).get(WORKER_OUTPUT_KEY)
    state = node.config.stash.get(_state_key, None)
    if outlived and state is not None:
        state.outlived[node.gateway.id] = outlived


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash.get(_state_key, None)
    for where, pids in sorted(state.outlived.items()) if state is not None else []:
        terminalreporter.write_line(
            f"shardscale: {len(pids)} process(es) started by ranks{f' of {where}' if where else ''} "
            f"outlived the session and were killed: {pids}",
            red=True,
        )


def pytest_report_header(config: pytest.Config) -> str | None:
    state = config.stash.get(_state_key, None)
    if state is None or not state.require_gpus:
        return None
    return strict_gpu_message(state.require_gpus, f"this machine has {state.gpus()} CUDA GPUs")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is None:
        return
    try:
        configs = from_marker(marker.args, marker.kwargs)
    except ValueError:
        return  # reported on the test itself (pytest_collection_modifyitems), not as a collection error
    if len(configs) > 1:
        metafunc.parametrize(_CASE_PARAM, configs, ids=[c.id for c in configs])


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Decide GPU skips now, so a test that cannot run starts no process (before ``-m`` selection)."""
    state = config.stash[_state_key]
    for item in items:
        if isinstance(getattr(item, "cls", None), type) and issubclass(item.cls, DistributedTestCase):
            _collect_test_case(item, state)
            continue
        marker = item.get_closest_marker(MARKER)
        if marker is None:
            continue
        callspec = getattr(item, "callspec", None)
        if callspec is not None and _CASE_PARAM in callspec.params:
            dist_config = callspec.params[_CASE_PARAM]
        else:
            try:
                (dist_config,) = from_marker(marker.args, marker.kwargs)
            except ValueError as exc:
                item.stash[_setup_error_key] = f"invalid @pytest.mark.{MARKER}(...) on {item.name}: {exc}"
                continue
        item.stash[_config_key] = dist_config
        if dist_config.backend == "nccl":
            _needs_gpus(
                item,
                state,
                dist_config.world_size,
                functools.partial(gpu_skip_reason, dist_config.world_size),
            )


def _collect_test_case(item: pytest.Item, state: SessionState) -> None:
    """A ``harness.DistributedTestCase`` method (pytest's unittest item): its configuration, and the
    skips decided now: ``@unittest.skip...``, NCCL without the GPUs, ``harness.skip_if_lt_x_gpu``."""
    try:
        test = item.cls(item.name)
        reason = unittest_skip_reason(test)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
            return
        dist_config = case_config(test)
    except Exception as exc:  # noqa: BLE001 - a bad class is an error of its tests, the others run
        item.stash[_setup_error_key] = str(exc)
        return
    item.stash[_config_key] = dist_config
    if dist_config.backend == "nccl":
        _needs_gpus(
            item, state, dist_config.world_size, functools.partial(gpu_skip_reason, dist_config.world_size)
        )
    needed = min_gpus(test)
    if needed:
        _needs_gpus(item, state, needed, functools.partial(lt_x_gpu_reason, needed))


def _needs_gpus(item: pytest.Item, state: SessionState, count: int, reason: Callable[[int], str]) -> None:
    """Mark ``item`` ``gpu``; with fewer than ``count`` GPUs skip it, or in strict mode (``count``
    within ``--require-gpus``) make it fail at setup. ``reason(have)`` says why."""
    item.add_marker(pytest.mark.gpu)
    item.stash[_gpus_needed_key] = max(count, item.stash.get(_gpus_needed_key, 0))
    have = state.gpus()
    if have >= count:
        return
    if count <= state.require_gpus:
        item.stash[_setup_error_key] = strict_gpu_message(state.require_gpus, reason(have))
    else:
        item.add_marker(pytest.mark.skip(reason=reason(have)))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fail, as an error of this test, what collection found wrong with it."""
    error = item.stash.get(_setup_error_key, None)
    if error is not None:
        pytest.fail(error, pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """In strict GPU mode a test marked ``gpu`` that skipped (``skipif(no CUDA)``, ``pytest.skip``)
    fails instead: on a GPU runner a skip means the GPUs are missing, and CI must not go green."""
    outcome = yield
    report = outcome.get_result()
    state = item.config.stash[_state_key]
    if not (state.require_gpus and report.skipped and item.get_closest_marker("gpu")):
        return
    if hasattr(report, "wasxfail"):
        return
    dist_config = item.stash.get(_config_key, None)
    needed = item.stash.get(_gpus_needed_key, dist_config.world_size if dist_config is not None else None)
    if needed is not None and needed > state.require_gpus:
        return  # needs more GPUs than this runner promises: a legitimate skip
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = strict_gpu_message(
        state.require_gpus,
        f"this machine has {state.gpus()} CUDA GPUs and {item.nodeid} was skipped: {reason}",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run a ``distributed`` test on the ranks instead of here, and turn the verdict into the outcome."""
    dist_config = pyfuncitem.stash.get(_config_key, None)
    if dist_config is None:
        return None
    kwargs = {}
    for name in pyfuncitem._fixtureinfo.argnames:
        value = pyfuncitem.funcargs[name]
        try:
            pickle.dumps(value)
        except Exception as exc:  # noqa: BLE001 - any pickling error is the same user mistake
            pytest.fail(
                f"argument {name!r} of a distributed test must be picklable to reach the ranks ({exc}); "
                "create the object inside the test body instead",
                pytrace=False,
            )
        kwargs[name] = value
    state = pyfuncitem.config.stash[_state_key]
    verdict, results = state.run(pyfuncitem, _target(pyfuncitem.function), dist_config, (), kwargs)
    state.raise_outcome(pyfuncitem, verdict, results)
    return True


# -- fixtures ---------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _shardscale_case() -> None:
    """Placeholder that ``pytest_generate_tests`` parametrizes with one :class:`DistConfig` per id."""
    return None


def _only_in_distributed(request: pytest.FixtureRequest, name: str) -> None:
    if request.node.get_closest_marker(MARKER) is None:
        pytest.fail(
            f"the {name!r} fixture only exists in tests marked @harness.distributed(...); "
            f"elsewhere call harness.current().{name} inside the rank",
            pytrace=False,
        )


@pytest.fixture
def rank(request: pytest.FixtureRequest) -> Any:
    """This rank's index (filled in inside each rank of a distributed test)."""
    _only_in_distributed(request, "rank")
    return Placeholder.RANK


@pytest.fixture
def world_size(request: pytest.FixtureRequest) -> Any:
    """The number of ranks (filled in inside each rank of a distributed test)."""
    _only_in_distributed(request, "world_size")
    return Placeholder.WORLD_SIZE


class Ranks:
    """Runs module-level functions on the ranks from an ordinary test (the ``ranks`` fixture)."""

    def __init__(self, state: SessionState, node: pytest.Item) -> None:
        self._state = state
        self._node = node

    def run(
        self,
        func: Any,
        *args: Any,
        world_size: int = 2,
        backend: str = "gloo",
        deadline: float | None = None,
        collective_timeout: float | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """Call ``func(*args, **kwargs)`` on every rank; return the results ordered by rank.

        Raises :class:`harness.RankFailure` naming every rank that failed or died, skips the test
        when every rank skipped, and fails it on an asymmetric skip.
        """
        config = DistConfig(
            world_size=world_size,
            backend=backend,
            deadline_s=deadline,
            collective_timeout_s=collective_timeout,
        )
        if backend == "nccl" and self._state.gpus() < world_size:
            reason = gpu_skip_reason(world_size, self._state.gpus())
            if world_size <= self._state.require_gpus:
                pytest.fail(strict_gpu_message(self._state.require_gpus, reason), pytrace=False)
            pytest.skip(reason)
        verdict, results = self._state.run(self._node, _target(func), config, args, kwargs)
        if verdict.outcome == "failed":
            raise RankFailure(self._state.failure_text(self._node, verdict, results))
        if verdict.outcome == "skipped":
            pytest.skip(verdict.message)
        if verdict.outcome == "xfailed":
            pytest.xfail(verdict.message)
        return verdict.values


@pytest.fixture
def ranks(request: pytest.FixtureRequest) -> Ranks:
    """Run a module-level function on N ranks and get each rank's return value."""
    return Ranks(request.config.stash[_state_key], request.node)


@pytest.fixture(scope="module")
def module_ranks(request: pytest.FixtureRequest) -> Ranks:
    """``ranks`` for module-scoped fixtures: one rank run whose result many tests read.

    A failure is reported (and reproduced, and its rank logs kept) under the module's node id, and
    pytest re-raises it for every test that uses the fixture.
    """
    return Ranks(request.config.stash[_state_key], request.node)
