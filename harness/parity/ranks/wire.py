"""What crosses from the ranks to the judge: one frozen record per thing measured (rank side, pure).

Every rank function the runner calls by name (``entry.run_batch``, ``staged.run_batch``,
``localize.run_batch``, ``phases.run_batch``) returns a list of these, one per request; the pool
pickles each rank's list with the standard pickler (tensors travel by value, on the CPU) and the
judge (``judge/``) reads them by field. A record has named, documented fields, so a field one side
renames is an error where the record is made, not a ``KeyError`` (or a silent ``.get`` default) in
the judge, and a number has a name instead of a place in a list.

The records, by the rank function that makes them:

* a step of a run (``train.Run``): :class:`RankStep`, its full tensors :class:`StepTensors`, its
  distances :class:`Partial`, a resume row's audit :class:`ResumeAudit`; a run: :class:`RankRun`;
  one configuration's reference and candidate: :class:`RankRow` (``entry.run_one``, and each half
  of a resharded row, ``phases.run_half``), with the expected gap :class:`Gap`;
* the staged check (``staged.run_one``): :class:`StagedRun` of :class:`StagedStep`, each tensor
  :class:`Compared` (or, reduced, :class:`Bounded`);
* the localization (``localize.run_one``): :class:`Probed`, each side :class:`ProbedSide`, the ops
  inside the first diverging module :class:`ProbedOps`.

Why here, at the bottom of ``ranks/``: every room of the rank side makes some of them (the loop
modules, ``measure/`` the distances and the gap, ``restart/`` a resume's audit), and ``measure/``
and ``restart/`` are independent of each other, so the records live below both
(docs/architecture.md: a name both a lower and a higher stage need moves down to the lower one).
Records are frozen; the dicts they hold are keyed by a tensor's name (or kind), never by a field.
"""

from __future__ import annotations

import dataclasses

import torch

Tensors = dict[str, torch.Tensor]
"""Tensors by name (on the CPU, in their own dtype)."""
Meta = dict[str, tuple[tuple[int, ...], torch.dtype]]
"""Each tensor's full shape and dtype, by name."""
Named = tuple[tuple[str, torch.Tensor], ...]
"""Tensors in the order they were recorded, each with its name."""

_RECORD = dataclasses.dataclass(frozen=True, kw_only=True, slots=True)


# -- a training run, step by step ----------------------------------------------------------------
@_RECORD
class Partial:
    """One rank's piece of one tensor against the same elements of its reference: what
    ``distance.merged`` merges exactly into the tensor's distance (largest distances, summed
    counts)."""

    max_abs: float
    max_rel: float
    mismatched: int
    """Elements of the piece outside the row's tolerance profile."""
    numel: int
    """Elements of the piece."""
    max_ulp: float
    """The largest distance in units in the last place (``inf``: NaN against a number)."""


@_RECORD
class StepTensors:
    """Full tensors of one step (rank 0, on the steps whose tensors travel)."""

    params: Tensors
    """Parameters after the step, by name."""
    grads: Tensors
    """Gradients as the optimizer received them, unscaled (and clipped on ``unscale_clip``); empty
    at a step with a planted fault whose gradients were not compared."""
    optim_state: dict[str, Tensors]
    """Optimizer state after the step, by parameter name then state key."""


@_RECORD
class ResumeAudit:
    """What a resume row's candidate measured of its own load (``restart/resume.py``), on the
    resumed step and every step after it: what ``judge/causes/resume.py`` names."""

    step: int
    """The resumed step (the checkpoint was saved after the step before it)."""
    restored: dict[str, tuple[str, ...]]
    """By group (``weights``, ``optimizer``, ``optimizer_step``, ``scaler``, ``rng``,
    ``schedulers``, ``misplaced``), what differed from the saved state right after the load (this
    rank's own shards); a group that was restored is absent."""
    weights_at_forward: bool | None
    """Whether the weights equalled the saved ones when the resumed step's forward began
    (``None``: not audited, as when the load went into another layout)."""
    world_sizes: tuple[int, int] | None = None
    """A resharded row's ``(saving, resuming)`` world sizes; ``None``: one world size."""


@_RECORD
class RankStep:
    """One rank's part of one optimizer step of one run (``record.rank_step``): its scalars, and
    either its full tensors or what its check measured of them (``stepcheck.Check``)."""

    loss: float
    """This rank's unscaled loss."""
    scale: float
    """The scale after ``update()``."""
    tracker: int
    """The growth tracker after ``update()``."""
    found_inf: tuple[float, ...]
    """By optimizer: the found_inf the scaler held after ``step()``."""
    skipped: tuple[bool | None, ...]
    """By optimizer: whether ``step()`` left this rank's parameters bitwise unchanged (``None``:
    the rank holds no element of them)."""
    tensors: StepTensors | None = None
    """Full tensors (rank 0, on the steps whose tensors travel); ``None``: none travel."""
    buffers: Tensors = dataclasses.field(default_factory=dict)
    """This rank's own module buffers after the step (a run recorded whole; empty otherwise)."""
    clip_norm: float | None = None
    """What this rank's ``clip_grad_norm_`` returned (``None``: no clip)."""
    accumulated_in: str | None = None
    """The dtype unreduced microbatch gradients were summed in (``None``: none were)."""
    checkpoint: str | None = None
    """How checkpointed units were recomputed (``replay``, ``no_replay``; ``None``: none were)."""
    compiled: str | None = None
    """What ran compiled, read off the modules (``3 modules, inductor``; ``None``: nothing did)."""
    meta: dict[str, Meta] | None = None
    """By kind (``grad``, ``param``, ``optim_state``: rank 0; ``buffer``: this rank's own), each
    tensor's full shape and dtype by the judge's name; ``None``: read them off :attr:`tensors`."""
    diffs: dict[str, dict[str, Partial]] | None = None
    """By kind and name, this rank's pieces measured against the reference (a candidate's);
    ``None``: not measured here (the judge measures the full tensors)."""
    grad_squares: dict[str, float] | None = None
    """By gradient, the sum of squares of this rank's elements in float64 (the norm's parts);
    ``None``: not measured here."""
    resume: ResumeAudit | None = None
    """A resume row's candidate, from the resumed step on: its audit."""


@_RECORD
class FunctionFacts:
    """What a user's ``parallelize`` function did that explains a difference by itself."""

    never_reduced: tuple[str, ...] = ()
    """Trainable parameters under no ``fully_shard`` and no DDP: each rank keeps its own gradient."""
    split_ties: tuple[str, ...] = ()
    """Ties of the model as built that the function's units hold apart (``lm_head.weight =
    embed.weight``): FSDP keeps a copy for each unit, and the copies part after the first step."""
    stage_ties: tuple[tuple[str, ...], ...] = ()
    """A pipeline's tied parameters, each a copy per stage holding it (``("embed.weight",
    "output.weight")``): their gradients must be summed across the stages."""
    pipeline: tuple[str, int, bool] | None = None
    """A pipeline a user's function built: its schedule (``SCHEDULES`` key), microbatch count,
    and whether its units reshard after forward (the configuration says these for built-in rows)."""


@_RECORD
class RankRun:
    """One rank's part of one run (``record.rank_run``): the controller merges every rank's into
    one ``RunRecord`` (``record.merge_rank_runs``)."""

    rank: int
    steps: tuple[RankStep, ...]
    """Every step this rank finished, in order."""
    counters: dict[str, int]
    """The scaler's ``steps``/``skipped_steps``/``growths``/``backoffs`` after the last step
    (empty: a scaler without counters, or a run that failed)."""
    error: str | None
    """The failure text, prefixed ``[rank N]``; the steps stop there."""
    duration_s: float
    """This rank's training time (not the time it waited for a reference run in lockstep)."""
    compile_s: float | None = None
    """What compiling cost this rank's run (``sides/compiled.py``): its first step's time beyond
    the median of the others; ``None``: it compiled nothing."""
    facts: FunctionFacts | None = None
    """A user's function: what was read off its modules that the known causes name
    (``sides/user/discover.py``); ``None`` for the built-in engines."""


@_RECORD
class Gap:
    """How far one run is from another over every step, in relative and absolute terms: the
    *expected* gap between a mixed-precision reference and the same training in float32 (which
    includes the steps the low precision skipped on overflow and float32 did not;
    ``measure/gap.py`` measures it)."""

    loss_max_abs: float
    loss_max_rel: float
    param_max_abs: float
    param_max_rel: float

    def describe(self) -> str:
        return f"loss rel {self.loss_max_rel:.2g}, params rel {self.param_max_rel:.2g}"


@_RECORD
class RankRow:
    """One configuration on one rank (``entry.run_one``; a resharded row's half,
    ``phases.run_half``): its reference's and its candidate's runs, compared where the data lives."""

    id: str
    """The configuration's id."""
    reference: RankRun
    reference_description: str
    """What the reference was, in words."""
    candidate: RankRun | None
    """``None``: not run (the reference failed on some rank)."""
    candidate_description: str
    reference_reused: bool = False
    """The reference was kept from an earlier configuration of the batch (its time is not this row's)."""
    fp32_gap: Gap | None = None
    """A mixed-precision row: this rank's distance of its reference from a float32 twin
    (``None``: not measured)."""
    part: int = 0
    """A resharded row's half: 1 (at the saving world size) or 2; 0: a whole row."""

    @property
    def failed(self) -> bool:
        """Either run raised on this rank."""
        return bool(self.reference.error or (self.candidate is not None and self.candidate.error))


# -- the staged check ----------------------------------------------------------------------------
@_RECORD
class Compared:
    """One tensor of the candidate against the anchored reference's, elementwise, from a common
    state (``staged.py``). A tensor one side lacks, or of another shape: every element differs,
    ``inf`` ulp."""

    elements: int
    differing: int
    """Elements not bitwise equal."""
    max_ulp: float


@_RECORD
class Bounded:
    """One reduced gradient judged elementwise against the order-free bound of the exact mean of
    the ranks' local gradients (``measure/bound.py``)."""

    elements: int
    violations: int
    """Elements outside the bound: no order of summation gives them."""
    worst_ratio: float
    """The largest distance from the exact mean in units of the bound (> 1: a violation)."""


@_RECORD
class StagedStep:
    """One step of the staged check on one rank, stage by stage (``staged.py``); pairs are
    ``(candidate, reference)`` from the same state."""

    loss: tuple[float, float]
    local: dict[str, Compared] | None
    """By parameter, this rank's local gradients as they enter the reduction, every reduction's
    stacked; ``None``: not observable (the candidate's reducer could not be captured)."""
    poisoned: bool
    """A fault was planted at this step (its reduction is not bounded)."""
    reduction: dict[str, Bounded] = dataclasses.field(default_factory=dict)
    """Rank 0: by parameter, the candidate's reduced gradient against the bound (empty on a
    poisoned step and on the other ranks)."""
    reduction_names: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    """Rank 0: the names only the reference's mirrored reduction had, and those only the
    candidate's had."""
    reordered: int = 0
    """Rank 0: reduced elements whose bits differ from the mirror of the candidate's reduction."""
    clip: tuple[float, float] | None = None
    """Path ``unscale_clip``: the candidate's total norm and the reference's measure of the same
    gradients; ``None``: no clip."""
    update: dict[str, Compared] = dataclasses.field(default_factory=dict)
    """Rank 0: by ``param:name`` and ``optim_state:name:key``, after the step."""
    buffers: dict[str, Compared] = dataclasses.field(default_factory=dict)
    """This rank's own module buffers after the step."""
    scale: tuple[float, float]
    tracker: tuple[int, int]


@_RECORD
class StagedRun:
    """The staged check of one configuration on one rank (``staged.run_one``)."""

    id: str
    rank: int
    steps: tuple[StagedStep, ...]
    error: str | None
    """The failure text, prefixed ``[rank N]``; the steps stop there."""
    drift: tuple[float, ...] | None = None
    """On request (``drift.py``; rank 0, empty elsewhere): per step, the largest ulp distance
    between the reference trained twice, once summing its ranks in reverse order; ``None``: not
    asked."""
    duration_s: float


# -- the localization ----------------------------------------------------------------------------
@_RECORD
class ProbedSide:
    """One side's module values at the probed step on one rank (``localize.Probe``)."""

    forward: Named
    """Each module's forward output, in the order the modules finish their forward."""
    backward: Named
    """The gradient of the loss with respect to each module's output, in backward order."""


@_RECORD
class ProbedOps:
    """One level deeper: the ATen ops inside one module's forward, both sides (``measure/ops.py``)."""

    module: str
    """The module (this rank's first whose forward output diverged), as :class:`ProbedSide` names it."""
    reference: Named
    candidate: Named


@_RECORD
class Probed:
    """The localization of one configuration on one rank (``localize.run_one``)."""

    id: str
    step: int
    """The probed step."""
    reference: ProbedSide
    candidate: ProbedSide
    ops: ProbedOps | None = None
    """When a forward output diverged on some rank: this rank's first diverging module's ops."""
    error: str | None = None
    """Why the probe could not run (the rank's text)."""
    duration_s: float = 0.0


# -- the ground truth (truth/stage.py) ------------------------------------------------------------
@_RECORD
class TruthStep:
    """One step of the ground truth: the split's gradient against the whole batch's, in float64,
    from the whole batch's trajectory; at a step that differs, what can explain it."""

    step: int
    distance: float
    """``max |split - whole|`` over ``max |whole|`` (``truth/gradients.relative``)."""
    rounding: float
    """The same distance between the whole batch and itself with its samples reversed: what a
    reordering alone moves (the check of ``gradients.BOUND``'s assumption)."""
    pieces: tuple[str, ...] = ()
    """Each piece's name (``rank 1 microbatch 0``), in the order of :attr:`counts` and :attr:`weights`."""
    counts: tuple[int, ...] = ()
    """Each piece's count of items (``Workload.items``) or, undeclared, of samples."""
    counted: str = "samples"
    repeats: tuple[str, ...] = ()
    """Samples a later piece repeats (left out of the whole batch)."""
    as_served: float | None = None
    """With repeats: the split's distance from the batch as served (repeats kept)."""
    weights: tuple[float, ...] = ()
    """The weights of the pieces' own gradients that come closest to the whole batch's."""
    weights_residual: float | None = None
    """How far the weighed pieces still are from the whole batch (``None``: not fitted)."""
    factor: float = 1.0
    """The weight the split gives every piece (``pieces.Split.factor``)."""
    module: tuple[str, str, float] | None = None
    """The first module whose outputs on the pieces differ from the whole batch's: name, class,
    distance (``None``: every module agrees, or not measured)."""


@_RECORD
class TruthRun:
    """The ground truth of one split (``truth/stage.py``)."""

    split: str
    """How the candidate's setup splits a step, in words."""
    steps: tuple[TruthStep, ...] = ()
    """Every step measured, up to and including the first that differs."""
    unsupported: str = ""
    """Why the stage cannot judge this workload (a skip)."""
    error: str = ""
    """The traceback of a stage that failed to run."""
    duration_s: float = 0.0
    parameters: int = 0
