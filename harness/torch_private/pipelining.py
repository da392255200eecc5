"""``torch.distributed.pipelining`` internals the harness reads off a schedule a user's function
built: its stages and its microbatch count.

Read from torch 2.11, 2.12, 2.13 and 2.14 (``schedules.py``): the same attributes; 2.12 rewrote
how the schedules set up their point-to-point sends, and 2.11's V-shaped schedules cannot run on
gloo (:func:`unsupported`).
"""

from __future__ import annotations

from typing import Any

from harness.torch_private import UnsupportedTorch, at_least


def stages_of(schedule: Any) -> tuple[Any, ...]:
    """The stages a schedule runs on this rank (``_stages`` of a multi-stage schedule, ``_stage``
    of a single-stage one)."""
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti

    if isinstance(schedule, PipelineScheduleMulti):
        return tuple(schedule._stages)
    return (schedule._stage,)


def microbatches_of(schedule: Any) -> int:
    """How many microbatches the schedule cuts each batch into (``_n_microbatches``)."""
    return int(schedule._n_microbatches)


V_SHAPED = frozenset({"ScheduleZBVZeroBubble", "ScheduleDualPipeV"})
"""Schedules that place two stages on each rank in a V (rank ``r`` holds ``r`` and ``2 pp - 1 - r``)."""


def unsupported(schedule: str, backend: str) -> str | None:
    """Why the installed torch cannot run ``schedule`` (a class name of
    ``torch.distributed.pipelining``) over ``backend``, or ``None``.

    Measured: torch 2.11's V-shaped schedules fail on gloo at their first step (the candidate's
    collective raises "Pair is not connected" after the 60 s timeout), in the built-in rows and a
    user's function alike; torch 2.12 rewrote the schedules' P2P set-up (``_warmup_p2p``) and runs
    them bitwise. NCCL was not measured."""
    if schedule in V_SHAPED and backend == "gloo" and not at_least(2, 12):
        return str(
            UnsupportedTorch(
                f"{schedule} on gloo (its first step fails: 'Pair is not connected')", needs="2.12"
            )
        )
    return None


def refuse_unsupported(schedule: Any, backend: str) -> None:
    """Raise :class:`UnsupportedTorch` if the installed torch cannot run ``schedule`` (an instance)
    over ``backend`` (:func:`unsupported`): before its first step, not after a timeout."""
    name = type(schedule).__name__
    if unsupported(name, backend) is not None:
        raise UnsupportedTorch(
            f"{name} on gloo (its first step fails: 'Pair is not connected')", needs="2.12"
        )
