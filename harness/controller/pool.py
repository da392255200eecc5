"""The controller side of the warm rank pool (runs inside pytest; never joins a process group).

Why a pool: starting ranks costs seconds (each imports torch); a forkserver that has imported
``harness.rank.rank_main`` once turns that into milliseconds, and ranks kept alive across tests make a
trivial test cost one round trip. The process group is re-created only when the backend or world
size changes, or after a case that did not pass (a failed rank closes its connections so its
peers are not left waiting, and the group must be rebuilt).

One thread (the caller of :meth:`RankPool.run`) owns all state: ``_loop_once`` waits on every
rank's pipe and process sentinel, turns what it sees into messages, and hands each to the case in
flight (``case_run.CaseRun``, which dispatches it to an ``_on_<kind>`` method and keeps the
case's deadline rules). Every wait has a deadline. When a case misses its deadline, or a rank dies,
or ranks are still running ``peer_grace_s`` after another rank failed, the pool dumps the Python
stack of every live rank (``faulthandler`` on ``SIGUSR1``), kills every rank's process group and
starts afresh on the next case.

Interruptions: whatever leaves :meth:`RankPool.run` early (Ctrl-C, pytest-timeout's exception raised
by its ``SIGALRM`` handler, any exception a signal handler raises) finds ranks in an unknown state,
perhaps still inside the case. ``run`` then kills them before the interruption goes on (printing
their stacks to stderr first, unless it is Ctrl-C), so the next case starts on fresh ranks and
``close`` has nothing to wait for. If even that cleanup is cut short, the pool is still marked
busy, and the next ``run`` or ``close`` kills the ranks first.

Every process the pool starts, and all they start, carry this controller's tag in their environment
(``harness/controller/reaper.py``): leftovers are found and killed by that tag, never by recycled pids.
"""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing as mp
import multiprocessing.connection
import os
import shutil
import sys
import tempfile
import time
import uuid
import weakref
from typing import Any

from harness.controller import reaper
from harness.controller.case_run import CaseRun
from harness.controller.rank_handle import OutputCallback, RankHandle, Tail, dump_stacks
from harness.outcome import RankResult
from harness.protocol import (
    Ack,
    InitGroup,
    LeaveGroup,
    Message,
    RankCrashed,
    RankFiles,
    RankStarted,
    RunCase,
    Shutdown,
    from_wire,
)
from harness.spec import DistConfig

_OUTPUT_POLL_S = 0.1  # how often a running case's output is read: "live" for a person watching
_live_pools: weakref.WeakSet[RankPool] = weakref.WeakSet()  # pools of this process with ranks up


class PoolError(RuntimeError):
    """The pool could not start ranks or build a process group (the message says which rank and why)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CaseSpec:
    """One case for the pool: what to call, where, and how long it may take."""

    target: str
    """``module:qualname`` of a function importable in the ranks."""
    config: DistConfig
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    deadline_s: float = 60.0
    collective_timeout_s: float = 30.0

    @classmethod
    def of(
        cls,
        target: str,
        config: DistConfig,
        *,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        default_deadline_s: float,
    ) -> CaseSpec:
        """The case with ``config``'s deadline and collective timeout, or the defaults they leave
        open (the deadline ``default_deadline_s``, the collective timeout half the deadline)."""
        deadline, collective = config.timeouts(default_deadline_s)
        return cls(
            target=target,
            config=config,
            args=args,
            kwargs=kwargs or {},
            deadline_s=deadline,
            collective_timeout_s=collective,
        )


class RankPool:
    """Rank processes kept warm across cases. Use :meth:`run`; call :meth:`close` at the end."""

    def __init__(
        self,
        *,
        threads_per_rank: int = 1,
        start_timeout_s: float = 120.0,
        peer_grace_s: float = 5.0,
        log_dir: str | None = None,
        on_output: OutputCallback | None = None,
        preload: tuple[str, ...] = (),
    ) -> None:
        """``on_output(rank, stream, text)``, if given, receives what the ranks of a running case
        print, as whole lines, while the case runs (the pytest plugin echoes it, labelled by rank,
        into the test's captured output). Every result also carries its rank's output.
        ``preload``: modules the forkserver imports for the ranks (``reaper.preload``)."""
        if threads_per_rank < 1:
            raise ValueError(f"threads_per_rank must be >= 1, got {threads_per_rank}")
        self.threads_per_rank = threads_per_rank
        self.start_timeout_s = start_timeout_s
        self.peer_grace_s = peer_grace_s
        self.on_output = on_output
        self._own_log_dir = log_dir is None
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="shardscale-ranks-")
        self._ranks: list[RankHandle] = []
        self._store: Any = None
        self._group: tuple[str, int] | None = None
        self._case_ids = itertools.count(1)
        self._session = uuid.uuid4().hex[:8]
        self._tag = reaper.controller_tag()
        self.started_ranks = 0
        self._busy = False
        """Commands are out whose answers were not all read: the ranks may be inside a case."""
        self._in_flight: CaseRun | None = None
        self._ctx = mp.get_context("forkserver")
        reaper.preload(*preload)

    # -- public ---------------------------------------------------------------------------------
    @property
    def pids(self) -> list[int]:
        return [h.pid for h in self._ranks if h.pid is not None and not h.gone]

    def run(self, case: CaseSpec) -> list[RankResult]:
        """Run ``case`` on ranks ``0..world_size-1`` and return one result per rank (never raises for
        what the ranks did; raises :class:`PoolError` only when ranks cannot be started).

        An exception or signal that interrupts the wait leaves this method only after the ranks of
        the case are killed (see the module docstring), so the next case starts on fresh ranks.
        """
        if self._busy:
            self.kill()  # an earlier run was interrupted and could not finish its cleanup
        self._busy = True
        try:
            results = self._run(case)
        except BaseException as exc:
            self._abandon(exc)
            raise
        self._busy = False
        return results

    def _run(self, case: CaseSpec) -> list[RankResult]:
        config = case.config
        self._ensure_group(config.backend, config.world_size, case.collective_timeout_s)
        case_id = next(self._case_ids)
        ranks = self._ranks[: config.world_size]
        run = CaseRun(
            ranks,
            case_id,
            deadline_s=case.deadline_s,
            peer_grace_s=self.peer_grace_s,
            on_output=self.on_output,
        )
        command = RunCase(
            case_id=case_id,
            target=case.target,
            args=case.args,
            kwargs=case.kwargs,
            sys_path=tuple(sys.path),
            prefix=f"{self._session}/case{case_id}",
            collective_timeout_s=case.collective_timeout_s,
        )
        self._in_flight = run
        for handle in ranks:
            handle.send(command)
        while not run.done:
            if time.monotonic() >= run.limit():
                run.stop()
                break
            events = self._loop_once(ranks, run.limit(), poll_s=_OUTPUT_POLL_S)
            run.output.pump()
            run.memory.sample()
            for event in events:
                run.dispatch(event)
        self._in_flight = None
        final = run.results()
        if any(r.status != "passed" for r in final):
            self._group = None  # failed ranks left the group; rebuild it before the next case
        if any(r.status in ("died", "timeout", "stopped") for r in final):
            self.kill()
        return final

    def close(self, timeout_s: float = 10.0) -> list[int]:
        """Ask every rank to exit, then kill what is left: ranks that have not exited within
        ``timeout_s``, and every process the ranks started that outlived them. Returns the pids of
        the latter (a test that leaks a process, or a daemon that escaped its rank's group).

        Ranks that may still be inside an interrupted case are killed at once: they would not read
        the request to exit."""
        if self._busy:
            self.kill()
            self._busy = False
        for handle in self._live():
            try:
                handle.send(Shutdown())
            except OSError:
                pass
        until = time.monotonic() + timeout_s
        for handle in self._ranks:
            handle.process.join(max(0.0, until - time.monotonic()))
        ranks = {h.pid for h in self._ranks if h.process.is_alive()}
        outlived = [pid for pid in self.leftovers() if pid not in ranks]
        self.kill()
        _live_pools.discard(self)
        self._store = None
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)
        return outlived

    def kill(self) -> None:
        """SIGKILL every rank's process group (the rank and any DataLoader workers), then every
        other process the ranks started (:meth:`leftovers`), and forget the ranks. A group is killed
        only while its leader carries our tag: an exited rank's pid may name a stranger's group."""
        for handle in self._ranks:
            if handle.pid is not None:
                reaper.killpg_if_tagged(handle.pid, self._tag)
            if handle.process.is_alive():
                handle.process.kill()
        for handle in self._ranks:
            handle.process.join(5.0)
            handle.conn.close()
        self._ranks = []
        self._group = None
        reaper.kill_until_gone(self.leftovers, self._tag, timeout_s=5.0)

    def _abandon(self, interruption: BaseException) -> None:
        """Kill the ranks of an interrupted :meth:`run`; first, unless the user pressed Ctrl-C (who
        wants the prompt back now), print where each rank of the case was to stderr (pytest shows it
        in the test's captured stderr, next to pytest-timeout's stack of the controller)."""
        in_flight, self._in_flight = self._in_flight, None
        try:
            if in_flight is not None:
                in_flight.output.finish()  # what the ranks printed before the interruption
            if in_flight is not None and not isinstance(interruption, KeyboardInterrupt):
                ranks = in_flight.ranks
                reason = f"{type(interruption).__name__}: {interruption}".rstrip(": ")
                stacks = dump_stacks(ranks, title=f"Python stacks when the case was interrupted ({reason})")
                sys.stderr.write("".join(f"{text}\n" for _, text in sorted(stacks.items())))
        finally:
            self.kill()
            self._busy = False

    def leftovers(self) -> list[int]:
        """Pids of the live processes this pool started, directly or not, wherever they went
        (another process group or session, a daemon): found by the controller's tag, never a stranger.

        Pools of one process share the tag: what another live pool's ranks claim (their groups and
        descendants) is left to it; an orphan outside every rank's group counts for every pool."""
        procs = reaper.tagged_processes(self._tag)
        others = [pid for pool in list(_live_pools) if pool is not self for pid in pool.pids]
        return sorted(set(procs) - reaper.family(procs, others))

    # -- starting ranks and groups --------------------------------------------------------------
    def _live(self) -> list[RankHandle]:
        return [h for h in self._ranks if not h.gone]

    def _start_ranks(self, world_size: int) -> None:
        from harness.controller.rendezvous import open_store

        if self._store is None:
            self._store, self._host, self._port = open_store()
        reaper.start_tagged_forkserver(self._tag)
        _live_pools.add(self)
        new = []
        for rank in range(len(self._ranks), world_size):
            parent_conn, child_conn = self._ctx.Pipe(duplex=True)
            files = RankFiles.in_dir(self.log_dir, rank, self.started_ranks)
            process = self._ctx.Process(
                target=_rank_entry,
                args=(rank, child_conn, files, os.getpid(), self._host, self._port, self.threads_per_rank),
                name=f"shardscale-rank{rank}",
                daemon=False,  # ranks may start DataLoader workers
            )
            process.start()
            child_conn.close()
            self.started_ranks += 1
            handle = RankHandle(rank, process, parent_conn, files)
            self._ranks.append(handle)
            new.append(handle)
        until = time.monotonic() + self.start_timeout_s
        while any(h.pid is None for h in new):
            if time.monotonic() > until:
                self.kill()
                raise PoolError(f"ranks did not start within {self.start_timeout_s}s")
            for event in self._loop_once(new, until):
                if isinstance(event, RankCrashed):
                    files = self._ranks[event.rank].files
                    log = "".join(Tail.whole(path) for path in (files.stderr, files.stacks))
                    self.kill()
                    raise PoolError(
                        f"rank {event.rank} died while starting (exit code {event.exitcode})\n{log}"
                    )

    def _ensure_group(self, backend: str, world_size: int, timeout_s: float) -> None:
        if self._group == (backend, world_size) and len(self._live()) >= world_size:
            return
        if len(self._live()) != len(self._ranks):
            self.kill()
        self._start_ranks(world_size)
        prefix = f"{self._session}/group{next(self._case_ids)}"
        for handle in self._ranks:
            if handle.rank < world_size:
                handle.send(
                    InitGroup(
                        backend=backend, world_size=world_size, prefix=prefix, collective_timeout_s=timeout_s
                    )
                )
            else:
                handle.send(LeaveGroup())
        pending = {h.rank for h in self._ranks}
        until = time.monotonic() + self.start_timeout_s
        errors = []
        while pending and time.monotonic() < until:
            for event in self._loop_once(self._ranks, until):
                if isinstance(event, Ack):
                    pending.discard(event.rank)
                    if event.error:
                        errors.append(f"[rank {event.rank}] {event.command} failed:\n{event.error}")
                elif isinstance(event, RankCrashed):
                    pending.discard(event.rank)
                    errors.append(f"[rank {event.rank}] died while joining the group ({event.exitcode})")
        if pending or errors:
            self.kill()
            detail = "\n".join(errors) or f"ranks {sorted(pending)} did not answer in {self.start_timeout_s}s"
            raise PoolError(f"could not build a {backend} group of {world_size} ranks:\n{detail}")
        self._group = (backend, world_size)

    # -- the loop -------------------------------------------------------------------------------
    def _loop_once(self, handles: list[RankHandle], until: float, *, poll_s: float = 0.5) -> list[Message]:
        """Wait (at most until ``until``, and at most ``poll_s``) for pipes or exits of ``handles``;
        return what arrived."""
        live = [h for h in handles if not h.gone]
        if not live:
            return []
        by_object: dict[Any, RankHandle] = {}
        for h in live:
            by_object[h.conn] = h
            by_object[h.process.sentinel] = h
        timeout = max(0.0, min(until - time.monotonic(), poll_s))
        events: list[Message] = []
        for ready in multiprocessing.connection.wait(list(by_object), timeout):
            handle = by_object[ready]
            if handle.gone:
                continue
            if ready is handle.conn:
                try:
                    events.append(from_wire(handle.conn.recv()))
                    continue
                except (EOFError, OSError):
                    handle.process.join(2.0)
            while True:  # drain what the rank sent before it ended
                try:
                    if not handle.conn.poll():
                        break
                    events.append(from_wire(handle.conn.recv()))
                except (EOFError, OSError):
                    break
            handle.process.join(2.0)
            handle.gone = True
            events.append(RankCrashed(rank=handle.rank, exitcode=handle.process.exitcode))
        for event in events:
            if isinstance(event, RankStarted):
                self._ranks[event.rank].pid = event.pid
                reaper.warn_if_untagged(event.pid, self._tag, what=f"rank {event.rank}")
        return events


def _rank_entry(*args: Any) -> None:
    from harness.rank.rank_main import rank_entry

    rank_entry(*args)
