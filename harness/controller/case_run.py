"""One case in flight on the controller: which ranks answered, what they printed, and what is
decided when time runs out (controller side; fed by ``RankPool``'s loop).

Why apart from the pool: the pool owns processes and process groups; this object owns the rules of
one case's wait. The pool's loop, the one thread that owns state, hands it every event through
:meth:`CaseRun.dispatch` (``_on_<kind>``) and asks :meth:`CaseRun.limit` how long it may wait:

* the case's deadline, or ``peer_grace_s`` after the first rank that did not pass, whichever comes
  first. The deadline is a hang guard, not a size limit: it runs from the case's start, and a rank's
  heartbeat (``harness.heartbeat()``, sent by the parity engine every training step) restarts its
  clock for that rank, so a large model whose steps are slow but steady never misses it (a failed rank left the group, so its peers should fail soon; if they do not, they are
  stuck);
* at the limit, every rank still running gets ``timeout`` (the deadline) or ``stopped`` (the grace
  ran out) with its Python stacks; at the deadline, ranks that had finished get their stacks too;
* a rank that dies gets what :class:`~harness.controller.memory.MemoryWatch` found out: whether the
  OOM killer killed it, and the memory every rank held (sampled each time the loop wakes up).
"""

from __future__ import annotations

import dataclasses
import itertools
import pickle
import time

from harness.controller.memory import MemoryWatch
from harness.controller.rank_handle import CaseOutput, OutputCallback, RankHandle, dump_stacks
from harness.outcome import RankResult
from harness.protocol import CaseFinished, Heartbeat, Message, RankCrashed


class CaseRun:
    """The controller's record of one case on ``ranks``."""

    def __init__(
        self,
        ranks: list[RankHandle],
        case_id: int,
        *,
        deadline_s: float,
        peer_grace_s: float,
        on_output: OutputCallback | None,
    ) -> None:
        self.ranks = ranks
        self.case_id = case_id
        self.deadline_s = deadline_s
        started = time.monotonic()
        self._alive = {handle.rank: started for handle in ranks}
        """Each rank's last sign of progress (the case's start, then its heartbeats)."""
        self.memory = MemoryWatch({handle.rank: handle.pid for handle in ranks})
        self.peer_grace_s = peer_grace_s
        self.output = CaseOutput(ranks, on_output)
        """Made before the case is sent: only what the ranks print from now on is the case's."""
        self._results: dict[int, RankResult] = {}
        self._order = itertools.count()
        self._first_bad: float | None = None

    @property
    def done(self) -> bool:
        """Every rank has a result."""
        return len(self._results) == len(self.ranks)

    @property
    def deadline(self) -> float:
        """When (``time.monotonic()``) the slowest running rank's deadline runs out: ``deadline_s``
        after its last sign of progress."""
        running = [at for rank, at in self._alive.items() if rank not in self._results]
        return min(running, default=max(self._alive.values())) + self.deadline_s

    def limit(self) -> float:
        """Until when (``time.monotonic()``) the ranks may still answer."""
        if self._first_bad is None:
            return self.deadline
        return min(self.deadline, self._first_bad + self.peer_grace_s)

    def dispatch(self, event: Message) -> None:
        handler = getattr(self, f"_on_{event.kind}", None)
        if handler is not None:
            handler(event)

    def _on_heartbeat(self, event: Heartbeat) -> None:
        if event.case_id == self.case_id:
            self._alive[event.rank] = time.monotonic()

    def _on_case_finished(self, event: CaseFinished) -> None:
        if event.case_id != self.case_id:
            return  # a late answer to a case the pool gave up on
        self._record(
            RankResult(
                rank=event.rank,
                status=event.status,
                value=None if event.value is None else pickle.loads(event.value),
                text=event.text,
                headline=event.headline,
                order=next(self._order),
            )
        )

    def _on_rank_crashed(self, event: RankCrashed) -> None:
        if event.rank in self._results:
            return  # it had answered before it ended
        self._record(
            RankResult(
                rank=event.rank,
                status="died",
                exitcode=event.exitcode,
                order=next(self._order),
                stacks=self.output.crash_dump(event.rank),
                death=self.memory.explain_death(event.rank, event.exitcode),
            )
        )

    def _record(self, result: RankResult) -> None:
        self._results[result.rank] = result
        if result.status != "passed" and self._first_bad is None:
            self._first_bad = time.monotonic()

    def stop(self) -> None:
        """Time is up (:meth:`limit` has passed): give every rank still running its result."""
        status = "timeout" if time.monotonic() >= self.deadline else "stopped"
        title = "Python stacks at the deadline" if status == "timeout" else "Python stacks when stopped"
        stacks = dump_stacks(self.ranks, title=title)
        for handle in self.ranks:
            rank = handle.rank
            if rank not in self._results:
                result = RankResult(
                    rank=rank, status=status, order=next(self._order), stacks=stacks.get(rank, "")
                )
                self._results[rank] = result
            elif status == "timeout" and rank in stacks:
                # Every rank's stack belongs in the report, finished ranks included.
                self._results[rank] = dataclasses.replace(self._results[rank], stacks=stacks[rank])

    def results(self) -> list[RankResult]:
        """One result per rank, in rank order, each with what its rank printed during the case."""
        self.output.finish()
        return [self.output.attach(self._results[h.rank]) for h in self.ranks]
