"""What the parity engine trains: a :class:`Workload` (model, data, loss, FSDP units).

Why a value built by a factory: the ranks import the factory by name (``module:function``) and
call it themselves, so a Workload may hold lambdas and closures and never crosses a process
boundary; only the factory's name travels in a :class:`harness.parity.ParityConfig`. The built-in
workloads (``mlp``, ``transformer``, ``frozen``, ``embedding``, ``llama``, ``convnet``) are
Workloads made by factories too, resolved by the same code (``harness.parity.workload.registry.get``).

This module imports no torch, so ``from harness.parity import Workload`` stays cheap.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - annotations only
    import torch
    from torch import nn

NAME = re.compile(r"^[A-Za-z0-9_.]+$")
"""A workload name is one word of a configuration id (ids join their parts with ``-``)."""


class WorkloadError(ValueError):
    """A workload that cannot be used; the message names what is wrong and the fix."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Workload:
    """A model, its data and loss, and which of its modules FSDP wraps as units.

    The engine owns everything else: wrapping (DDP, FSDP1, FSDP2), mixed precision and its DDP
    reference, the scaler, planted faults, recording and comparison. Example::

        def resmlp() -> Workload:          # a module-level factory without arguments
            return Workload(
                name="resmlp",
                model=MyNet,
                batch=lambda rank, step: (torch.randn(8, 16), torch.randint(0, 4, (8,))),
                loss=lambda model, batch: nn.functional.cross_entropy(model(batch[0]), batch[1]),
                units=(MyBlock,),
            )
    """

    name: str
    """One word (letters, digits, ``_``, ``.``): it appears in every configuration id."""
    model: Callable[[], nn.Module]
    """``() -> nn.Module`` in float32; called under one fixed seed, so every rank gets the same
    weights (the engine casts and moves it)."""
    batch: Callable[[int, int], Any]
    """``(rank, step) -> batch`` on the CPU (tensors, or tuples, lists and dicts of them). torch's
    global RNG is seeded per ``(seed, rank, step)`` around the call, so ``torch.randn`` here is
    deterministic; the batch must be the same every time it is asked for."""
    loss: Callable[..., torch.Tensor]
    """``(model, batch) -> scalar loss``. ``model`` is the wrapped model (DDP or FSDP): call it,
    do not reach into it. In mixed precision its inputs are cast to the low dtype, as FSDP does;
    torch's RNG is seeded per ``(seed, rank, step)`` around the call, so dropout draws the same
    masks under DDP and under FSDP.

    ``(model, batch, num_items) -> loss``: a loss with a parameter named ``num_items`` receives
    the step's total count of :attr:`items` over the whole global batch (every data-parallel
    rank's, every microbatch's), as transformers passes ``num_items_in_batch``: write it as a sum
    over this batch's items divided by ``num_items``. Such a loss is each microbatch's share of
    the whole batch's, so the engine neither divides it by the microbatch count nor lets the
    data-parallel average shrink it: it multiplies it by ``accumulate x data-parallel size``,
    which both undo (``harness.parity.ranks.sides.items``)."""
    units: tuple[type[nn.Module], ...] | str = ()
    """Module classes whose instances become FSDP units (FSDP1 ``ModuleWrapPolicy``; FSDP2
    ``fully_shard`` on each, innermost first); the root is always wrapped too. ``"auto"``: the
    classes the model's class names in ``_no_split_modules`` (Hugging Face models; see
    ``harness.parity.workload.units``)."""
    optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer] | None = None
    """``params -> optimizer``; ``None``: the matrix's optimizers (SGD with momentum, fused Adam)."""
    steps: int | None = None
    """Training steps per run; ``None``: the matrix's default (6)."""
    sparse: bool = False
    """Sparse gradients (built-in ``embedding``): trained in the run's precision throughout, against
    one process training on every rank's batch (FSDP does not shard sparse gradients)."""
    finish_batch: Callable[[Any, torch.dtype, float], Any] | None = None
    """``(batch, dtype, current scale) -> batch``, for data that depends on the loss scale."""
    recipe: str | None = None
    """The precision recipe the user trains with (``pure-bf16``, ``bf16-reduce32``, ``autocast-fp16``,
    ``mixed-bf16``, ...: ``harness.parity.plan.recipe.RECIPES``); the workload's matrix then runs
    it under every engine layout. ``None``: every recipe under a few layouts. Checked by the
    matrix (an unknown name is a :class:`WorkloadError` listing the names)."""
    clip: float | None = None
    """The max norm the user clips at after ``unscale_`` (``clip_grad_norm_``); the workload's
    matrix then clips at it under every engine layout (the CLI's ``--clip`` replaces it)."""
    accumulate: int | None = None
    """Microbatches per optimizer step the user accumulates (>= 2), run under every engine layout
    (``--accumulate`` replaces it)."""
    sync: str | None = None
    """With ``accumulate``: ``every`` microbatch reduced, or only the ``last``; ``None``: both."""
    checkpoint: bool = False
    """The user checkpoints the units' activations (RNG state preserved): run under every layout."""
    exact_sums: bool = False
    """Every gradient element sums exactly over the ranks in any order (small dyadic values, as the
    built-in ``canary``'s): its rows are judged bitwise on every backend and world size, where
    others fall back to a tolerance (NCCL)."""
    save: Callable[[str, nn.Module, Any, Any], None] | None = None
    """The user's own checkpoint save, ``save(folder, model, optimizer, scaler)``, called on every
    rank (``model`` the wrapped module as the candidate trains it, ``folder`` one directory every
    rank sees); declared with :attr:`load`, it adds resume rows that test *this* code (see
    ``harness.parity.ranks.restart.resume``)."""
    load: Callable[[str, nn.Module, Any, Any], None] | None = None
    """The user's own checkpoint load, ``load(folder, model, optimizer, scaler)``, into a fresh
    model (new random weights), optimizer and scaler, on every rank."""
    scheduler: Callable[[Any], Any] | None = None
    """``optimizer -> torch.optim.lr_scheduler.LRScheduler``, stepped after every optimizer step on
    both sides, and saved and restored with the rest by a resume row."""
    tp_plan: dict[str, Any] | str | None = None
    """Tensor parallelism (``Mesh.tp``): ``{module name or pattern: ParallelStyle}`` exactly
    as ``torch.distributed.tensor.parallel.parallelize_module`` takes it (``*`` matches one name
    part: ``{"layers.*.attention.q": ColwiseParallel(), "layers.*.attention.o": RowwiseParallel()}``),
    or ``"auto"``: a Hugging Face model's ``config.base_model_tp_plan`` (``workload/tp_plan.py``);
    ``None``: no TP rows."""
    loss_parallel: bool = False
    """Your training step runs the loss and its backward under torch's ``loss_parallel()``
    (torchtitan's with TP: the output head ``ColwiseParallel(use_local_output=False)``, the
    cross-entropy computed on the vocabulary-sharded logits): both sides do, and the twin hands
    its loss the candidate's sharded logits (``ranks/sides/tp/mirror.py``)."""
    pp_split: tuple[str, ...] | str | None = None
    """Pipeline parallelism (``Mesh.pp``): the modules where each stage after the first begins, as
    torchtitan's ``pipeline_parallel_split_points`` (``("layers.1",)``), or ``"auto"``: the model's
    top-level modules (a ``ModuleList``/``ModuleDict``'s entries one by one) cut into as many
    stages as the schedule runs, evenly by count. A stage is the model with every module outside
    it set to ``None`` (torchtitan's convention): its ``forward`` must skip what is ``None``
    (``x = self.embed(x) if self.embed is not None else x``). ``None``: no PP rows."""
    pp_io: Callable[[Any], tuple[torch.Tensor, torch.Tensor]] | None = None
    """With ``pp_split``: ``batch -> (first stage's input, loss target)``, the two tensors the
    schedule cuts into microbatches along dim 0 (``None`` under ``"auto"`` on a Hugging Face causal
    LM: its token ids and labels, ``workload/hf_pipeline.py``)."""
    pp_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    """With ``pp_split``: ``(last stage's output, target) -> one microbatch's loss``, a mean over it
    (the schedule divides the summed gradients by the microbatch count)."""
    joint_losses: Callable[[nn.Module, list[Any]], list[torch.Tensor]] | None = None
    """``(model, batches) -> one loss per batch`` from a single forward pass (for the sparse
    single-process reference, whose gradient must come out of one backward call)."""

    items: Callable[[Any], int] | None = None
    """``batch -> int``: how many items the loss averages over in one batch (tokens whose label is
    not ignored, samples), for a loss that takes ``num_items``; the ground-truth stage also reads
    it to say how unevenly a per-microbatch mean weighs the pieces. ``None``: not declared."""

    parallelize: Callable[[nn.Module, Any], nn.Module] | None = None
    """``(model, mesh) -> model``: the user's own parallelization, as their training script calls it
    (``fully_shard`` per block and at the root with their policies, activation checkpointing,
    ``torch.compile``, a TP plan, or DDP). The engine calls it unchanged on every rank, on a fresh
    :attr:`model`, with a ``DeviceMesh`` of the run's world size (``--mesh dp=2,tp=2``: the user's
    names and sizes), reads what it did from torch's own state, and checks *that* against the
    unsharded twin; the workload's rows are then the user's setup itself, not the FSDP matrix
    (``harness.parity.ranks.sides.user``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME.match(self.name):
            raise WorkloadError(
                f"Workload.name must be one word of letters, digits, '_' or '.', got {self.name!r} "
                "(it becomes part of every configuration id); use e.g. name='resmlp'"
            )
        for field in ("model", "batch", "loss"):
            if not callable(getattr(self, field)):
                raise WorkloadError(
                    f"Workload {self.name!r}: {field} must be callable, got {type(getattr(self, field)).__name__}"
                )
        self._check_loop()
        if isinstance(self.units, (list, set, frozenset)):
            object.__setattr__(self, "units", tuple(self.units))  # frozen: the one normalisation
        if self.units != "auto" and (
            not isinstance(self.units, tuple) or not all(isinstance(u, type) for u in self.units)
        ):
            raise WorkloadError(
                f"Workload {self.name!r}: units must be a tuple of module classes or 'auto', got {self.units!r}; "
                "use e.g. units=(MyBlock,), or units='auto' for a model whose class names _no_split_modules"
            )
        if self.optimizer is not None and not callable(self.optimizer):
            raise WorkloadError(
                f"Workload {self.name!r}: optimizer must be a callable params -> torch.optim.Optimizer "
                f"or None, got {self.optimizer!r}"
            )
        self._check_checkpointing()
        self._check_items()
        if self.parallelize is not None and not callable(self.parallelize):
            raise WorkloadError(
                f"Workload {self.name!r}: parallelize must be a callable (model, mesh) -> model, got "
                f"{type(self.parallelize).__name__}; pass the function itself, e.g. parallelize=parallelize_llama"
            )
        if (
            self.tp_plan is not None
            and self.tp_plan != "auto"
            and (
                not isinstance(self.tp_plan, dict)
                or not self.tp_plan
                or not all(isinstance(k, str) for k in self.tp_plan)
            )
        ):
            raise WorkloadError(
                f"Workload {self.name!r}: tp_plan must be a non-empty dict of module name or pattern -> "
                f"ParallelStyle, or 'auto', got {self.tp_plan!r}; use e.g. "
                "tp_plan={'layers.*.ffn.up': ColwiseParallel(), 'layers.*.ffn.down': RowwiseParallel()}"
            )
        if self.pp_split not in (None, "auto") and not (callable(self.pp_io) and callable(self.pp_loss)):
            raise WorkloadError(
                f"Workload {self.name!r}: pp_split needs pp_io (batch -> (input, target)) and pp_loss "
                "((output, target) -> loss): the schedule feeds the first stage and scores the last "
                "(pp_split='auto' on a Hugging Face causal LM has both by default)"
            )
        if self.loss_parallel and self.tp_plan is None and self.parallelize is None:
            raise WorkloadError(
                f"Workload {self.name!r}: loss_parallel=True needs tensor parallelism (a tp_plan, or a "
                "parallelize function with one) whose output head keeps its logits sharded: "
                "ColwiseParallel(use_local_output=False)"
            )
        if isinstance(self.pp_split, list):
            object.__setattr__(self, "pp_split", tuple(self.pp_split))
        if self.steps is not None and (not isinstance(self.steps, int) or self.steps < 1):
            raise WorkloadError(
                f"Workload {self.name!r}: steps must be an int >= 1 or None, got {self.steps!r}"
            )

    @property
    def takes_num_items(self) -> bool:
        """Whether :attr:`loss` has a ``num_items`` parameter (the whole batch's count of items)."""
        return _takes_num_items(self.loss)

    def loss_of(self, model: nn.Module, batch: Any, num_items: int | None = None) -> torch.Tensor:
        """:attr:`loss` on one batch, given ``num_items`` when it takes it."""
        if self.takes_num_items:
            if num_items is None:
                raise WorkloadError(f"Workload {self.name!r}: its loss takes num_items, and none was given")
            return self.loss(model, batch, num_items=num_items)
        return self.loss(model, batch)

    def losses(
        self, model: nn.Module, batches: Iterable[Any], num_items: int | None = None
    ) -> list[torch.Tensor]:
        """One loss per batch (the single-process reference trains on every rank's batch)."""
        batches = list(batches)
        if self.joint_losses is not None:
            return self.joint_losses(model, batches)
        return [self.loss_of(model, batch, num_items) for batch in batches]

    def _check_items(self) -> None:
        """A loss that takes ``num_items`` needs :attr:`items` to count them."""
        if self.items is not None and not callable(self.items):
            raise WorkloadError(
                f"Workload {self.name!r}: items must be a callable batch -> int or None, got {self.items!r}"
            )
        if self.takes_num_items and self.items is None:
            raise WorkloadError(
                f"Workload {self.name!r}: its loss takes num_items (the whole batch's count of items), "
                "so the engine must count them: declare items=, e.g. "
                "items=lambda batch: int((batch[1] != -100).sum())"
            )
        if self.takes_num_items and self.joint_losses is not None:
            raise WorkloadError(
                f"Workload {self.name!r}: a loss taking num_items with joint_losses is not supported; "
                "drop one of them"
            )

    def _check_checkpointing(self) -> None:
        """``save`` and ``load`` come as a pair of callables; ``scheduler`` is a callable."""
        if (self.save is None) != (self.load is None):
            given, missing = ("save", "load") if self.load is None else ("load", "save")
            raise WorkloadError(
                f"Workload {self.name!r}: {given} needs {missing} too (a resume row saves with one and "
                f"loads with the other); declare both, e.g. save=my_save, load=my_load"
            )
        for field in ("save", "load", "scheduler"):
            value = getattr(self, field)
            if value is not None and not callable(value):
                raise WorkloadError(
                    f"Workload {self.name!r}: {field} must be callable or None, got {type(value).__name__}"
                )

    def _check_loop(self) -> None:
        """The declared loop features, each refused with the fix when it cannot run."""
        if self.clip is not None and not (isinstance(self.clip, (int, float)) and self.clip > 0):
            raise WorkloadError(f"Workload {self.name!r}: clip must be a max norm > 0, got {self.clip!r}")
        if self.accumulate is not None and not (isinstance(self.accumulate, int) and self.accumulate >= 2):
            raise WorkloadError(
                f"Workload {self.name!r}: accumulate must be >= 2 microbatches (None: no accumulation), "
                f"got {self.accumulate!r}"
            )
        if self.sync not in (None, "every", "last"):
            raise WorkloadError(
                f"Workload {self.name!r}: sync must be 'every', 'last' or None, got {self.sync!r}"
            )


def _takes_num_items(loss: Callable[..., Any]) -> bool:
    try:
        return "num_items" in inspect.signature(loss).parameters
    except (TypeError, ValueError):  # a builtin without a signature takes no keyword of ours
        return False
