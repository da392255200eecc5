"""Run a list of configurations on ranks and judge each (controller side).

Why it does not own processes: the CLI runs it on a :class:`harness.controller.pool.RankPool` of its own,
the pytest suites on the session's warm pool (the ``module_ranks`` fixture), so the caller passes
an *executor*: ``execute(batch, backend, world_size)`` runs ``entry.run_batch(batch)`` on
``world_size`` ranks and returns every rank's list of results (rank order), or raises
:class:`BatchFailed` with the harness's report when a rank failed, died or missed its deadline.
Configurations that cannot run here become ``skip`` results with their reason and cost nothing.
Rows whose straight comparison was not bitwise go to the staged check first (``ranks/staged.py``,
``judge/staged.py``: one more rank call per batch, ``target=STAGED_TARGET``), which decides their
verdict from a re-anchored reference. Configurations that fail are then localized (``localize.py``,
``pinpoint.py``): one more rank call per batch, ``execute(requests, backend, world_size,
target=LOCALIZE_TARGET)`` with ``(config, step, anchor)`` requests, so a passing matrix costs
nothing more. The step is where the staged check first found a stage differing (else the straight
comparison's first divergence), replayed from the candidate's state on both sides when the staged
check can judge the row; a location that could begin neither from a common state nor re-anchored
says it is approximate, and why. Last, each row's known causes are weighed against everything
measured (``result.explained``): a cause whose premise the evidence refutes is ruled out.
A batch that does not come back from every rank (a rank died mid-batch, or missed its deadline) is
run again one configuration at a time on fresh ranks (the pool replaces them), so only the
configuration that kills a rank becomes an ``error`` result, and one broken configuration never
hides the others.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from harness.parity.doors import ground_truths, lanes, reshard
from harness.parity.judge import pinpoint, staged
from harness.parity.judge import result as results
from harness.parity.judge.result import ParityResult
from harness.parity.plan import profiles
from harness.parity.plan.config import ParityConfig, by_world, unsupported_reason
from harness.parity.ranks import requests
from harness.parity.ranks.measure.record import RunRecord

Executor = Callable[..., list[list[Any]]]
"""``execute(batch, backend, world_size, target=RANK_TARGET)``: every rank's list of results, one
record of ``harness.parity.ranks.wire`` per request (the target's, by rank: ``RankRow``,
``StagedRun``, ``Probed``). Each of ``RANK_TARGET``'s requests is a ``requests.Request`` (a configuration
and whether the rest of the run reads its reference again)."""
RANK_TARGET = f"{requests.RANK_MODULE}:run_batch"
TENSORS_TARGET = "harness.parity.ranks.entry:run_batch_keeping_tensors"
"""The same, with every step's full tensors in the records (``run(keep_tensors=True)``)."""
LOCALIZE_TARGET = "harness.parity.ranks.localize:run_batch"
STAGED_TARGET = "harness.parity.ranks.staged:run_batch"
"""The staged check of rows whose straight comparison was not bitwise (``judge/staged.py``)."""


def rank_function(target: str) -> Callable[..., Any]:
    """The function a ``module:function`` target names (an executor that calls it in-process)."""
    import importlib

    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


class BatchFailed(RuntimeError):
    """A batch did not come back from every rank; the message is the harness's verdict."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """One configuration's verdict, with the records it was judged on (``None`` when not run)."""

    result: ParityResult
    reference: RunRecord | None = None
    candidate: RunRecord | None = None

    @property
    def passed(self) -> bool:
        """The configuration held its tolerance (and, when the ground truth was asked for, its
        split trains like the whole batch, or the stage could not judge it: a skip)."""
        found = self.result.semantics
        return self.result.status == "pass" and (found is None or found.passed)

    @property
    def explanation(self) -> str:
        """The verdict, its first divergences and the candidate's error, one per line."""
        return describe(self)


def describe(outcome: Outcome) -> str:
    """A failure message: the verdict and its first divergences, one per line."""
    result = outcome.result
    lines = [f"{result.config.id}: {result.status} (profile {result.profile})"]
    lines += [d.message for d in result.divergences[:8]]
    if result.worst is not None:
        lines.append(f"worst tensor: step {result.worst.step}, {result.worst.describe()}")
    if outcome.candidate is not None and outcome.candidate.error:
        lines.append(outcome.candidate.error)
    if result.semantics is not None and result.semantics.status != "pass":
        lines.append(f"ground truth: {result.semantics.line()}")
        if result.semantics.cause is not None:
            lines.append(result.semantics.cause.describe())
        lines += [ruled.describe() for ruled in result.semantics.ruled_out]
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Progress:
    """What a progress callback is told after each configuration."""

    done: int
    total: int
    elapsed_s: float
    outcome: Outcome
    ran: int = 0
    """Configurations that ran so far (skips cost nothing and do not count)."""
    to_run: int = 0
    """Configurations that run in all."""

    @property
    def eta_s(self) -> float:
        """Time left, at the pace of the configurations that ran so far."""
        return self.elapsed_s / self.ran * (self.to_run - self.ran) if self.ran else 0.0


def _chunks(items: list[ParityConfig], size: int) -> Iterator[list[ParityConfig]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def run(
    configs: Iterable[ParityConfig],
    execute: Executor,
    *,
    gpus: int = 0,
    batch_size: int = 8,
    keep_records: bool = True,
    on_progress: Callable[[Progress], None] | None = None,
    localize: bool = True,
    keep_tensors: bool = False,
    drift: bool = False,
    ground_truth: bool = False,
    parallel: Sequence[Executor] = (),
) -> list[Outcome]:
    """Judge every configuration (in the given order), localizing each failure unless
    ``localize`` is False; see the module docstring. ``parallel``: more executors, each on ranks of
    its own: each world's rows are split among ``execute`` and these, and run at once
    (``lanes.py``; progress is then reported in the order rows finish). The records hold full tensors only for the
    steps the known causes read, unless ``keep_tensors`` (every step: for tests that read them).
    ``drift``: each row the staged check decides also gets the drift a reordering alone produces.
    ``ground_truth``: each row also gets its split's ground truth (``judge/semantics.py``), each
    split measured once, before the rows run."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    configs = list(configs)
    outcomes: dict[str, Outcome] = {}
    started = time.monotonic()

    runnable = [config for config in configs if unsupported_reason(config, gpus=gpus) is None]
    ran = 0
    truths = ground_truths.Pending(runnable, execute, parallel, BatchFailed) if ground_truth else None
    lock = threading.Lock()  # lanes finish rows from their own threads

    def finish(outcome: Outcome) -> None:
        with lock:
            _finish(outcome)

    def _finish(outcome: Outcome) -> None:
        nonlocal ran
        outcomes[outcome.result.config.id] = outcome
        ran += outcome.result.status != "skip"
        if on_progress is not None:
            on_progress(
                Progress(
                    done=len(outcomes),
                    total=len(configs),
                    elapsed_s=time.monotonic() - started,
                    outcome=outcome,
                    ran=ran,
                    to_run=len(runnable),
                )
            )

    for config in configs:
        reason = unsupported_reason(config, gpus=gpus)
        if reason is not None:
            finish(Outcome(result=results.skipped(config, reason)))

    def finish_all(judged: list[Judged]) -> None:
        for verdict, reference, candidate in judged:
            if keep_records:
                finish(Outcome(result=verdict, reference=reference, candidate=candidate))
            else:
                finish(Outcome(result=verdict))

    plain = [config for config in runnable if config.resume.world_size is None]
    executors = [execute, *parallel] if truths is None else truths.executors
    for (backend, world_size), group in by_world(plain):

        def work(
            dealer: lanes.Dealer, lane_execute: Executor, backend=backend, world_size=world_size
        ) -> None:
            while dealt := dealer.take():  # whole families: the references they share are theirs
                sent = {request.config.id: request for request in requests.requests(dealt)}
                for batch in _chunks(dealt, batch_size):
                    finish_all(
                        _judged_batch(
                            batch, lane_execute, backend, world_size, localize, keep_tensors, drift, sent
                        )
                    )

        dealer = lanes.Dealer(group, batch_size, lanes=len(executors))
        lanes.run([dealer] * dealer.lanes, executors, work)
    resharded = [config for config in runnable if config.resume.world_size is not None]
    for _, group in reshard.groups(resharded):  # two halves, at two world sizes (reshard.py)
        for batch in _chunks(group, batch_size):
            finish_all(reshard.judged_batch(batch, execute, BatchFailed))
    return [outcomes[config.id] if truths is None else truths.on(outcomes[config.id]) for config in configs]


Judged = tuple[ParityResult, "RunRecord | None", "RunRecord | None"]


def _judged_batch(
    batch: list[ParityConfig],
    execute: Executor,
    backend: str,
    world_size: int,
    localize: bool,
    keep_tensors: bool = False,
    drift: bool = False,
    sent: dict[str, requests.Request] | None = None,
) -> list[Judged]:
    """The verdicts of ``batch`` (each sent as ``sent`` has it: with whether the rest of the run
    reads its reference again, ``requests.Request``). When the batch does not come back (a rank
    died mid-batch: a C++ abort, a segfault, the OOM killer; or missed its deadline), each of its
    configurations runs again alone, on the fresh ranks the executor starts, so only the one that kills a rank is an
    ``error`` row (with its own report: the rank, the signal, where each rank was) and the others
    get their own verdicts."""
    items = [sent.get(config.id, config) for config in batch] if sent else batch
    try:
        if keep_tensors:
            per_rank = execute(items, backend, world_size, target=TENSORS_TARGET)  # type: ignore[call-arg]
        else:
            per_rank = execute(items, backend, world_size)
    except BatchFailed as failure:
        if len(batch) == 1:
            return [(results.failed_batch(batch[0], str(failure)), None, None)]
        return [
            judged
            for config in batch
            for judged in _judged_batch(
                [config], execute, backend, world_size, localize, keep_tensors, drift, sent
            )
        ]
    judged: list[Judged] = [
        results.judge(config, [rank[index] for rank in per_rank]) for index, config in enumerate(batch)
    ]
    judged = _staged(judged, execute, backend, world_size, drift)
    if localize:
        judged = _localized(judged, execute, backend, world_size)
    return [(results.explained(v, r, c), r, c) for v, r, c in judged]


def _staged(
    judged: list[Judged], execute: Executor, backend: str, world_size: int, drift: bool = False
) -> list[Judged]:
    """``judged`` with the staged check's verdict on each row it can judge whose straight
    comparison was not bitwise (one rank call for all of them; none when every row was bitwise);
    ``drift``: with the drift a reordering alone produces (``ranks/drift.py``)."""
    configs = [
        verdict.config
        for verdict, _, _ in judged
        if staged.wanted(verdict.config, verdict.status, verdict.max_ulp, verdict.expected_failure)
    ]
    if not configs:
        return judged
    try:
        requests = [(config, drift) for config in configs]
        per_rank = execute(requests, backend, world_size, target=STAGED_TARGET)  # type: ignore[call-arg]
        found = {
            config.id: staged.judge(config, [rank[index] for rank in per_rank])
            for index, config in enumerate(configs)
        }
    except BatchFailed as failure:
        found = {config.id: staged.Staged(passed=False, error=str(failure)) for config in configs}
    return [(_with_staged(v, found[v.config.id]) if v.config.id in found else v, r, c) for v, r, c in judged]


def _with_staged(verdict: ParityResult, found: staged.Staged) -> ParityResult:
    """``verdict`` decided by the staged check: a pass when every stage held at every step (the
    straight comparison's distances stay, as the drift a reordering leaves), a fail naming the
    first stage that did not. A check that could not run leaves a failed row failed and makes a
    passing one an ``error`` (the harness could not establish it), with the check's traceback."""
    if found.error:  # a pass it was meant to decide cannot stand on a fallback alone
        if verdict.status != "pass":
            return dataclasses.replace(verdict, staged=found)
        return dataclasses.replace(
            verdict, status="error", reason=found.summary(), detail=found.error, staged=found
        )
    if found.passed:
        return dataclasses.replace(verdict, status="pass", reason="", staged=found)
    first = found.findings[0].line()
    reason = verdict.reason if verdict.status == "fail" else f"staged check: {first}"
    return dataclasses.replace(verdict, status="fail", reason=reason, staged=found)


def where_to_localize(verdict: ParityResult) -> tuple[int, bool, str] | None:
    """For a failed row: the step to probe, whether to re-anchor the reference to the candidate's
    state before it, and why the location is approximate (empty: it begins from a common state).
    ``None`` when the row is not localizable (``result.localizable``)."""
    step = results.localizable(verdict)
    if step is None:
        return None
    if step == 0:
        return 0, False, ""
    if staged.unjudged(verdict.config) is None:
        return step, True, ""
    drifted = [d for d in verdict.distances if d.step < step and (d.max_ulp > 0 or d.failed)]
    if not drifted:
        return step, False, ""
    return (
        step,
        False,
        f"the straight runs already differed at step {drifted[0].step} (up to "
        f"{max(d.max_ulp for d in drifted):.3g} ulp) and {staged.unjudged(verdict.config)}, so the step "
        "cannot be replayed from a common state: a module that this drift alone moved may come first",
    )


def _localized(judged: list[Judged], execute: Executor, backend: str, world_size: int) -> list[Judged]:
    """``judged`` with a localization on each failed verdict (one rank call for all of them)."""
    wanted = {v.config.id: where for v, _, _ in judged if (where := where_to_localize(v)) is not None}
    requests = [(v.config, *wanted[v.config.id][:2]) for v, _, _ in judged if v.config.id in wanted]
    if not requests:
        return judged
    try:
        per_rank = execute(requests, backend, world_size, target=LOCALIZE_TARGET)  # type: ignore[call-arg]
        found = {}
        for index, (config, step, anchored) in enumerate(requests):
            approximate = wanted[config.id][2]
            # From a common state a module one ulp off is where it broke: bitwise, whatever fallback
            # the straight comparison used; an approximate location keeps the row's own profile.
            profile = profiles.profile_for(config) if approximate else profiles.EXACT
            found[config.id] = pinpoint.locate(
                step,
                [rank[index] for rank in per_rank],
                profile,
                anchored=anchored,
                approximate=approximate,
            )
    except BatchFailed as failure:
        found = {
            config.id: pinpoint.Localization(step=step, error=str(failure)) for config, step, _ in requests
        }
    return [
        (dataclasses.replace(v, localization=found[v.config.id]) if v.config.id in found else v, r, c)
        for v, r, c in judged
    ]


def deadline_hint(deadline_per_config_s: float) -> str:
    """What a person whose configuration missed its deadline reads: the deadline guards against
    hangs (every training step restarts it), and the flag that raises it."""
    return (
        f"a rank made no progress (no training step finished) for {deadline_per_config_s:g}s: "
        "if it is only slow (a large model, a busy machine) and not hung, raise the limit with "
        "`python -m harness.parity --deadline SECONDS` (make parity ARGS='--deadline SECONDS')"
    )


def pool_executor(pool: Any, *, deadline_per_config_s: float = 60.0) -> Executor:
    """An executor on a :class:`harness.controller.pool.RankPool` (the CLI's)."""
    from harness.controller.pool import CaseSpec
    from harness.outcome import judge
    from harness.spec import DistConfig

    def execute(
        batch: list[Any], backend: str, world_size: int, target: str = RANK_TARGET
    ) -> list[list[Any]]:
        deadline = 30.0 + deadline_per_config_s * len(batch)
        config = DistConfig(
            world_size=world_size,
            backend=backend,
            deadline_s=deadline,
            collective_timeout_s=min(deadline_per_config_s, deadline / 2),
        )
        spec = CaseSpec.of(target, config, args=(batch,), default_deadline_s=deadline)
        rank_results = pool.run(spec)
        verdict = judge(rank_results, world_size=world_size)
        if verdict.outcome != "passed":
            message = verdict.message or verdict.summary
            if any(r.status == "timeout" for r in rank_results):
                message += "\n" + deadline_hint(deadline_per_config_s)
            raise BatchFailed(message)
        return verdict.values

    return execute
