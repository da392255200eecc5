"""Which engine each role of a configuration trains with (rank side): the candidate's engine, or
its reference twin (``references.py``).

Why its own module: the engines and the references both build on ``engines.Engine``, and the choice
between them needs all of them; a test that plants a bug in a candidate replaces :func:`build`
here, for the duration of a rank call.
"""

from __future__ import annotations

import torch

from harness.parity.plan.config import ParityConfig
from harness.parity.ranks.sides import stages as pp_split
from harness.parity.ranks.sides import twin
from harness.parity.ranks.sides.engines import FSDP1, FSDP2, Engine, unit_modules
from harness.parity.ranks.sides.full import gather
from harness.parity.ranks.sides.pipeline import candidate as pp_candidate
from harness.parity.ranks.sides.pipeline import halves
from harness.parity.ranks.sides.pipeline import twin as twin_pp
from harness.parity.ranks.sides.references import LowPrecisionDDP, MirroredDDP, SingleProcess
from harness.parity.ranks.sides.tp import candidate as tp_candidate
from harness.parity.ranks.sides.tp import mirror as tp_mirror
from harness.parity.workload import registry, tp_plan


def build(config: ParityConfig, role: str, device: torch.device) -> Engine:
    """The engine of ``role`` (``reference`` or ``candidate``) for ``config``."""
    if config.engine == "user":  # the user's own function and its twin (``user/``)
        from harness.parity.ranks.sides.user import candidate, pipeline_sides, reference

        if config.mesh.user_stages is not None:  # the function builds a pipeline
            if role == "candidate":
                return pipeline_sides.UserPipeline(config, device)
            return pipeline_sides.build_twin(config, device)
        return (
            candidate.UserParallel(config, device) if role == "candidate" else reference.build(config, device)
        )
    if role == "candidate":
        cls = {"ddp": Engine, "fsdp1": FSDP1, "fsdp2": FSDP2}[config.engine]
        if config.mesh.tp is not None:
            cls = tp_candidate.FSDP2TP
        if config.mesh.pp is not None:
            cls = pp_candidate.PipelineFSDP2
    elif config.reference == "single":
        cls = SingleProcess
    elif config.policy is not None and not registry.get(config.workload).sparse:
        cls = LowPrecisionDDP
    elif (config.engine in ("fsdp1", "fsdp2") or config.resume.layout is not None) and not registry.get(
        config.workload
    ).sparse:
        cls = MirroredDDP
    else:
        cls = Engine
    if role == "reference" and config.mesh.pp is not None:  # the same microbatches, whole
        cls = twin_pp.mirror(cls)
    engine = cls(config, device)
    if role == "reference" and config.mesh.pp is not None:
        cut = pp_split.of_rank(
            engine.workload, engine.module, config.mesh, engine.rank // (engine.world_size // config.mesh.pp)
        )
        io, loss = pp_split.io_and_loss(engine.workload, engine.module)
        mesh = config.mesh
        moves = halves.built_in(config, engine.module)
        engine.piping = twin_pp.Piping(mesh.schedule, mesh.microbatches, io, loss, cut.holds, moves)  # type: ignore[attr-defined]
    if config.precision.autocast is not None:
        engine.description += f", forward under torch.autocast({config.precision.autocast})"
    if role == "reference" and config.engine == "fsdp2" and cls is not SingleProcess:
        # The twin of FSDP2's autograd graph too: its units' inputs pass one identity node each.
        model = engine.trained_module()
        twin.mirror_fsdp2_inputs(model, unit_modules(model, engine.units))
    if role == "reference" and config.mesh.tp is not None:
        # The twin of TP's arithmetic: each TP'd linear as partial products, summed as the candidate sums.
        model = engine.trained_module()
        shape, names = config.mesh.shape(config.world_size)  # type: ignore[misc]
        tp_mesh = gather.mesh(device.type, shape, names)["tp"]
        plan = tp_plan.resolve(engine.workload, model)
        split = tp_mirror.mirror(model, plan, config.mesh.tp, tp_mesh)
        engine.description += "; TP'd linears split as the candidate's plan: " + ", ".join(
            f"{name} ({kind})" for name, kind in split
        )
    return engine
