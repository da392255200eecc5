"""The pytest plugin (entry point ``shardscale``): marker, fixtures, skips, reports, cleanup.

Why it is thin: the rules live in ``outcome.py``, the processes in ``pool.py``; this module only
maps pytest's life cycle onto them. It imports the pool lazily, so a session without distributed
tests starts no process and does not import torch. Plugin state sits in ``config.stash`` and is
created only on the process that runs tests (each xdist worker owns its own pool).
"""

from __future__ import annotations

import pickle
import re
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from harness.outcome import RankFailure, RankResult, Verdict, judge
from harness.protocol import Placeholder
from harness.spec import MARKER, DistConfig, from_marker

_CASE_PARAM = "_shardscale_case"
_state_key = pytest.StashKey["_State"]()
_config_key = pytest.StashKey[DistConfig]()
_setup_error_key = pytest.StashKey[str]()
"""Why a test must fail at setup instead of running (a bad marker; strict GPU mode without GPUs)."""
_WORKER_OUTPUT_KEY = "shardscale_outlived"


class _State:
    """Session state: options, the lazily started pool, and the leftover-process check."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.deadline_s: float = config.getoption("dist_deadline")
        self.threads: int = config.getoption("rank_threads")
        self.require_gpus: int = config.getoption("require_gpus")
        self._log_root: Path | None = None
        self.pool: Any = None
        self.outlived: dict[str, list[int]] = {}
        """Pids of processes started by ranks that outlived the session and were killed, by where
        the pool ran: ``""`` here, an xdist worker id for a worker's pool (sent at its end)."""
        self._gpus: int | None = None

    def gpus(self) -> int:
        if self._gpus is None:
            import torch

            self._gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return self._gpus

    def get_pool(self) -> Any:
        if self.pool is None:
            from harness.pool import RankPool

            self.pool = RankPool(threads_per_rank=self.threads, on_output=echo_rank_output)
        return self.pool

    @property
    def log_root(self) -> Path:
        """``--rank-logs`` (relative to where pytest was started), else ``rank-logs`` under pytest's
        basetemp: a failed test's rank logs never land in the user's project by default."""
        if self._log_root is None:
            option = self.config.getoption("rank_logs")
            if option is not None:
                self._log_root = Path(self.config.invocation_params.dir, option)
            else:
                factory = getattr(self.config, "_tmp_path_factory", None)  # pytest's tmp_path plugin
                base = factory.getbasetemp() if factory is not None else Path(tempfile.mkdtemp())
                self._log_root = base / "rank-logs"
        return self._log_root

    def run(
        self, node: pytest.Item, target: str, config: DistConfig, args: tuple, kwargs: dict
    ) -> tuple[Verdict, list[RankResult]]:
        from harness.pool import CaseSpec

        deadline, collective = config.timeouts(self.deadline_s)
        spec = CaseSpec(
            target=target,
            config=config,
            args=args,
            kwargs=kwargs,
            deadline_s=deadline,
            collective_timeout_s=collective,
        )
        results = self.get_pool().run(spec)
        # What the ranks printed is already in the test's captured output (echo_rank_output).
        return judge(results, world_size=config.world_size, include_output=False), results

    def failure_text(self, node: pytest.Item, verdict: Verdict, results: list[RankResult]) -> str:
        """The verdict, where the rank logs went, and (last line) a command reproducing the test."""
        log_dir = self.log_root / re.sub(r"[^A-Za-z0-9_.-]+", "_", node.nodeid).strip("_")
        log_dir.mkdir(parents=True, exist_ok=True)
        for result in results:
            parts = [f"status: {result.status}", result.text, result.stacks]
            parts += [f"---- stdout ----\n{result.stdout}", f"---- stderr ----\n{result.stderr}"]
            (log_dir / f"rank{result.rank}.log").write_text("\n".join(p.rstrip() for p in parts if p) + "\n")
        return f"{verdict.message}\nrank logs: {log_dir}\n{repro_command(node)}"

    def close(self) -> None:
        """Close the pool (which kills what the ranks left running) and keep what it killed for the
        terminal summary; an xdist worker, whose terminal nobody sees, sends it to the controller."""
        if self.pool is None:
            return
        outlived = list(self.pool.close())
        self.pool = None
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput[_WORKER_OUTPUT_KEY] = outlived
        elif outlived:
            self.outlived[""] = outlived


def echo_rank_output(rank: int, stream: str, text: str) -> None:
    """Write what a rank printed to this process's stdout or stderr, each line labelled
    ``[rank N]``: pytest's capture puts it in the test's "Captured stdout/stderr" sections, and with
    ``-s`` it reaches the terminal while the test runs."""
    target = sys.stdout if stream == "stdout" else sys.stderr
    target.write("".join(f"[rank {rank}] {line}\n" for line in text.splitlines()))
    target.flush()


def repro_command(node: pytest.Item) -> str:
    """One line that reruns just this test from anywhere."""
    rootdir = node.config.rootpath
    return (
        f"reproduce: cd {shlex.quote(str(rootdir))} && {sys.executable} -m pytest {shlex.quote(node.nodeid)}"
    )


def gpu_skip_reason(world_size: int, have: int) -> str:
    """Why an NCCL configuration cannot run here, e.g. ``nccl world size 2 needs 2 CUDA GPUs, this
    machine has 0``."""
    gpus = "1 CUDA GPU" if world_size == 1 else f"{world_size} CUDA GPUs"
    return f"nccl world size {world_size} needs {gpus}, this machine has {have}"


def _strict(state: _State, reason: str) -> str:
    return f"strict GPU mode (--require-gpus {state.require_gpus}): {reason}"


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
    config.stash[_state_key] = _State(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_state_key, None)
    if state is not None:
        state.close()


def pytest_sessionfinish(session: pytest.Session) -> None:
    session.config.stash[_state_key].close()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """(xdist controller) Keep what a worker's pool killed at the end of its session."""
    outlived = getattr(node, "workeroutput", {}).get(_WORKER_OUTPUT_KEY)
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
    return _strict(state, f"this machine has {state.gpus()} CUDA GPUs")


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
            item.add_marker(pytest.mark.gpu)
            have = state.gpus()
            if have < dist_config.world_size:
                reason = gpu_skip_reason(dist_config.world_size, have)
                if dist_config.world_size <= state.require_gpus:
                    item.stash[_setup_error_key] = _strict(state, reason)
                else:
                    item.add_marker(pytest.mark.skip(reason=reason))


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
    if dist_config is not None and dist_config.world_size > state.require_gpus:
        return  # needs more GPUs than this runner promises: a legitimate skip
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = _strict(
        state, f"this machine has {state.gpus()} CUDA GPUs and {item.nodeid} was skipped: {reason}"
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
    if verdict.outcome == "failed":
        pytest.fail(state.failure_text(pyfuncitem, verdict, results), pytrace=False)
    if verdict.outcome == "skipped":
        pytest.skip(verdict.message)
    if verdict.outcome == "xfailed":
        pytest.xfail(verdict.message)
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

    def __init__(self, state: _State, node: pytest.Item) -> None:
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
                pytest.fail(_strict(self._state, reason), pytrace=False)
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
