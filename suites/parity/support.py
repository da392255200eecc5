"""Helpers the parity suites share (the fixtures are in ``conftest.py``)."""

from __future__ import annotations

from harness import RankFailure
from harness.parity import localize, rank_side, report, runner
from harness.parity.result import ParityResult

_SECONDS_PER_CONFIG = 60.0


def unaffected_by_expected_failures(func):
    """Mark a test whose assertion holds even where torch's scaler is expected to fail."""
    func.unaffected_by_expected_failures = True
    return func


def ranks_executor(ranks) -> runner.Executor:
    """A runner executor on the session's warm pool (``ranks``/``module_ranks``)."""

    def execute(batch, backend, world_size, target=runner.RANK_TARGET):
        deadline = 30.0 + _SECONDS_PER_CONFIG * len(batch)
        try:
            return ranks.run(
                localize.run_batch if target == runner.LOCALIZE_TARGET else rank_side.run_batch,
                batch,
                world_size=world_size,
                backend=backend,
                deadline=deadline,
                collective_timeout=_SECONDS_PER_CONFIG,
            )
        except RankFailure as failure:
            raise runner.BatchFailed(str(failure)) from failure

    return execute


def describe(outcome: runner.Outcome) -> str:
    """A failure message: the verdict and its first divergences, one per line."""
    result = outcome.result
    lines = [f"{result.config.id}: {result.status} (profile {result.profile})"]
    lines += [d.message for d in result.divergences[:8]]
    if result.worst is not None:
        lines.append(f"worst tensor: step {result.worst.step}, {result.worst.describe()}")
    if outcome.candidate is not None and outcome.candidate.error:
        lines.append(outcome.candidate.error)
    return "\n".join(lines)


def junit_properties(result: ParityResult) -> list[tuple[str, str]]:
    """A configuration's metrics as JUnit properties (``parity.status``, ``parity.profile``, ...):
    what CI dashboards show next to each parity test without opening parity.json."""
    worst = "-"
    if result.worst is not None:
        worst = f"step {result.worst.step}, {result.worst.describe()}"
    candidate = result.curves.get("candidate")
    properties = [
        ("parity.configuration", result.config.id),
        ("parity.status", report.label(result)),
        ("parity.profile", result.profile),
        ("parity.max_loss_diff", repr(result.max_loss_diff)),
        (
            "parity.first_diverging_step",
            "-" if result.first_diverging_step is None else str(result.first_diverging_step),
        ),
        ("parity.worst", worst),
        ("parity.skipped_steps", ",".join(map(str, result.skipped_steps)) or "-"),
        ("parity.measured", result.closeness or "-"),
        ("parity.localized", result.localization.describe() if result.localization is not None else "-"),
        ("parity.causes", ",".join(cause.name for cause in result.causes) or "-"),
        ("parity.time_s", f"{result.time_s:.3f}"),
    ]
    if candidate is not None and candidate.scale:
        properties += [
            ("parity.final_loss", repr(candidate.loss[-1][0])),
            ("parity.final_scale", repr(candidate.scale[-1])),
        ]
    return properties
