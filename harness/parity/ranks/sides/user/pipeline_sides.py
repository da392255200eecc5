"""The two sides of a pipeline a user's function builds (rank side): their schedule as the
candidate, the whole model running the same microbatches as its twin.

Why the built-in pipeline's engines serve: once the function has built its stages and schedule
(``pipeline.call``), training a step is what ``PipelineFSDP2`` does with its own (the schedule's
``step``, each microbatch's loss scaled as a user's loss function scales it, the loss sent from
the last stage), and measuring is too (each stage's tensors gathered within it and sent to rank
0). Only the building differs: nothing is cut, sharded or summed by the engine, the user's code
did all of it, tied copies included (a tie split across stages is refused, ``pipeline._merge``).
The twin is the user's twin (their units' buckets, policy and autograd nodes:
``reference.py``) running the microbatches of the schedule the function chose, in its order
(``pipeline/twin.py``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from harness.parity.plan.config import ParityConfig
from harness.parity.ranks.sides import compiled as compiling
from harness.parity.ranks.sides import stages as split
from harness.parity.ranks.sides.engines import Engine
from harness.parity.ranks.sides.pipeline import halves
from harness.parity.ranks.sides.pipeline import twin as twin_pp
from harness.parity.ranks.sides.pipeline.candidate import PipelineFSDP2
from harness.parity.ranks.sides.user import candidate, pipeline, reference
from harness.parity.ranks.sides.user.found import READ_FROM_TORCH
from harness.parity.ranks.wire import FunctionFacts
from harness.parity.workload import registry


class UserPipeline(PipelineFSDP2):
    """The stages and schedule the user's ``parallelize`` returned, trained as their loop would."""

    def __init__(self, config: ParityConfig, device: torch.device) -> None:
        Engine.__init__(self, config, device)  # the built-in pipeline's own building skipped
        name = getattr(self.workload.parallelize, "__qualname__", "parallelize")
        self.description = (
            f"your {name}() on mesh {config.mesh.words()}: {self.built.describe()}; "
            f"{self.found.summary()}{READ_FROM_TORCH}" + "; ".join(self.found.lines())
        )
        if self.found.compiled:  # the compile causes read these (``judge/causes/compiled.py``)
            self.compile_backend = self.found.compiled[0].backend_name
            self.compiled_count = len(self.found.compiled)
        resharded = any(unit.reshard.startswith("after forward") for unit in self.found.units)
        self.facts = FunctionFacts(
            never_reduced=self.found.never_reduced,
            pipeline=(self.built.key, self.built.microbatches, resharded),
        )

    def wrap(self, module: nn.Module) -> nn.Module:
        self.name_whole(module)  # before the function cuts it
        self.built, self.found = pipeline.call(self.config, module, self.device)
        if self.found.compiled:
            compiling.settle()
        built = self.built
        self.schedule = built.schedule
        self.stage_modules = [stage.submod for stage in built.stages]
        self.pp_group = built.stages[0].group
        self.pp_rank = dist.get_rank(self.pp_group)
        tp_rank = 0
        if self.found.tp_dim is not None:
            tp_rank = candidate.user_mesh(self.config, self.device)[self.found.tp_dim].get_local_rank()
        self.stage_owner = (tp_rank == 0, tp_rank == 0 and self.data_rank == 0)
        """The ranks at TP coordinate 0 compare their shards of their stages (the TP ranks of a dp
        coordinate hold the same shards of what TP does not split); the stage's first of them its
        whole tensors (``measure/local.py``)."""
        self.cut = split.Cut(built.held, built.count, ())
        self.io, self.loss = built.io, built.loss
        self.schedule_key, self.microbatches = built.key, built.microbatches
        self.schedule._loss_fn = self._loss_fn  # the user's loss, its value kept and scaled
        if built.key:
            self._check_order()
        self._scaler = None
        self._losses = []
        return self.stage_modules[0]


def build_twin(config: ParityConfig, device: torch.device) -> Engine:
    """The whole model on every rank as the twin of the function's pipeline (a ValueError naming
    what it cannot mirror). Collective: the function runs again on a throwaway model, as the
    twin of a function that returns a model reads it (``reference.found_by_twin``)."""
    throwaway = registry.build_model(registry.get(config.workload), config.seed).to(device)
    built, found = pipeline.call(config, throwaway, device)
    del throwaway
    if found.refused:
        raise ValueError(
            "the twin cannot mirror what your parallelize function did: " + "; ".join(found.refused)
        )
    base: type = reference.UserMirrored
    if reference.the_policy(found, config) is not None:
        base = reference.UserLowPrecision
    engine = twin_pp.mirror(base)(config, device, found)
    engine.piping = twin_pp.Piping(  # type: ignore[attr-defined]
        built.key,
        built.microbatches,
        built.io,
        built.loss,
        pipeline.holds(built),
        halves.by_name(getattr(built.schedule, "pipeline_order", None), built.stage_of),
    )
    engine.mirror_function()
    engine.description += (
        f"; the whole model over the {built.microbatches} microbatches of your "
        f"{type(built.schedule).__name__}, in its order, the sum divided by their count"
    )
    return engine  # type: ignore[no-any-return]
