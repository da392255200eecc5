"""The unsharded twin of a user's ``parallelize`` function (rank side).

The twin keeps what may legitimately change the numbers and drops what must not. Kept: each
``fully_shard`` unit's precision policy (the working copy, casts at the units it wraps, FSDP2's
autograd node per unit: ``twin.py``), ``torch.compile`` of the same modules with the same backend
object and flags, the linears a TP plan splits (computed as their partial products:
``tp/mirror.py``), the optimizer, the loss. Dropped: sharding, resharding and prefetch,
offload, activation checkpointing (the recompute of a correct checkpoint is the forward's), and
every divide factor and sync setting the function chose: the twin averages over the data-parallel
ranks as DDP does, through the candidate's own collectives on its buffers
(``reduce_layout.py``: one bucket per unit, in the group's order), so at any world size a correct
function is bitwise and a wrong one differs at the step it starts.

Why the twin calls the function again: it must not train what the function built (that is the
candidate), but it must know what it did before it builds itself, on every rank alike, whatever
order the sides are built in. So it runs the function on a throwaway copy and reads the result
(``candidate.run_function``), then builds itself from the workload's model as the function
received it. Whatever it cannot mirror (``Found.refused``) is an error here, before training.
"""

from __future__ import annotations

import torch
from torch import nn

from harness.parity.plan.config import ParityConfig
from harness.parity.plan.precision import PrecisionPolicy
from harness.parity.ranks.sides import checkpoint, reduce_layout, twin
from harness.parity.ranks.sides import compiled as compiling
from harness.parity.ranks.sides.engines import Engine
from harness.parity.ranks.sides.references import LowPrecisionDDP, MirroredDDP
from harness.parity.ranks.sides.tp import mirror as tp_mirror
from harness.parity.ranks.sides.user import candidate, policies
from harness.parity.ranks.sides.user.found import Found
from harness.parity.workload import registry, tp_plan


def found_by_twin(config: ParityConfig, device: torch.device) -> Found:
    """What the function does, read off a throwaway model it parallelized (the module docstring)."""
    throwaway = registry.build_model(registry.get(config.workload), config.seed).to(device)
    _, found = candidate.run_function(config, throwaway, device)
    return found


def the_policy(found: Found, config: ParityConfig) -> PrecisionPolicy | None:
    """The policy that stands for the units' (the first of them; each unit's own is emulated by
    ``policies.py``), ``None`` when every unit trains in float32. Units in different policies
    accumulating microbatches are refused: the hand accumulation sums in one dtype."""
    found_policies = [p for p in found.policies() if p is not None]
    if len(set(found.policies())) > 1 and config.loop.accumulate > 1:
        raise ValueError(
            "your fully_shard units have different MixedPrecisionPolicy values; accumulating "
            "microbatches over them is not mirrored yet (each unit's sum in its own dtype): run the "
            "plain rows, or give the units one policy"
        )
    return found_policies[0] if found_policies else None


class _Twin:
    """What both twins share: the function's units found again by name in the twin's model."""

    found: Found
    config: ParityConfig
    device: torch.device

    def unit_list(self, model: nn.Module) -> list[nn.Module]:
        """The modules the function made ``fully_shard`` units, the root excluded, in module order."""
        names = {unit.module for unit in self.found.units if unit.module}
        return [m for n, m in model.named_modules() if n in names]

    def user_layout(self, model: nn.Module) -> reduce_layout.Layout:
        """The candidate's buckets over ``model``: one per unit, its parameters in the group's order;
        parameters no unit holds (never reduced by the candidate) in one more, reduced as DDP would."""
        position = {id(p): i for i, p in enumerate(model.parameters())}
        index = {n: position[id(p)] for n, p in model.named_parameters(remove_duplicate=False)}
        buckets, held = [], set()
        for unit in self.found.units:  # a parameter two units claim (a tie re-made) counts once
            missing = [p for p in unit.params if p not in index]
            if missing:
                raise ValueError(
                    f"fully_shard({unit.module or 'the root'}) holds {missing}, which the model does not have"
                )
            bucket = tuple(dict.fromkeys(index[p] for p in unit.params if index[p] not in held))
            held.update(bucket)
            buckets.append(bucket)
        rest = tuple(i for i in range(len(position)) if i not in held)
        meshes = {unit.mesh for unit in self.found.units if unit.params}
        if len(meshes) > 1:
            raise ValueError(
                f"your fully_shard units shard over different meshes ({sorted(meshes)}): not mirrored"
            )
        dims = self.config.mesh.dims or ()  # always set for engine 'user' (``Mesh.check_dims``)
        unit_mesh = next(iter(meshes), ())
        names = tuple(name for name, _ in unit_mesh)
        if names and not set(names) <= {name for name, _ in dims}:
            raise ValueError(
                f"your fully_shard units shard over mesh dimensions {names}, which the mesh handed to "
                f"the function ({self.config.mesh.words()}) does not name: shard over its dimensions"
            )
        tp = None
        tp_dims: tuple[int | None, ...] = ()
        if self.found.tp:
            sharded = tp_plan.sharded_dims(dict(self.found.tp), model)
            tp_dims = tuple(sharded.get(name) for name, _ in model.named_parameters())
            degree = self.found.tp_degree or 1
            tp = ((self.config.world_size // degree, degree), ("dp", "tp"))
        return reduce_layout.Layout(
            engine="fsdp2",
            buckets=tuple(reduce_layout.Bucket(b) for b in [*buckets, rest] if b),
            mesh=tp,
            tp_dims=tp_dims,
            groups_from=(dims, names or (dims[0][0],)),
        )

    def checkpoint_under_compile(self, model: nn.Module) -> list[str]:
        """Checkpoint (replaying the RNG) the modules the function checkpointed inside a module it
        compiled; their names. Why kept there: eager, a correct recompute gives the forward's values
        and the twin drops it; compiled, the checkpointed region's backward is its own graph, which
        inductor fuses otherwise (measured: a tiny Hugging Face Llama, AC and ``compile()`` per
        block, float32: gradients 1e-3 apart at step 0 from a twin compiled without it)."""
        compiled = [spec.module for spec in self.found.compiled]
        inside = [
            name
            for name, _ in self.found.checkpointed
            if any(c == "" or name == c or name.startswith(c + ".") for c in compiled)
        ]
        if inside:
            checkpoint.apply(
                [model.get_submodule(n) for n in inside], replay=True, workload=self.config.workload
            )
        return inside

    def mirror_function(self) -> None:
        """FSDP2's autograd nodes, the TP split and the function's compiles, on the trained module."""
        model = self.trained_module()  # type: ignore[attr-defined]
        if self.found.units:
            twin.mirror_fsdp2_inputs(model, self.unit_list(model))
        words = [
            "the unsharded twin of your function: "
            + ("DDP around the root, as yours" if self.found.ddp else "DDP's forward")
        ]
        if self.found.tp:
            mesh = candidate.user_mesh(self.config, self.device)  # type: ignore[attr-defined]
            mesh = mesh[self.found.tp_dim] if self.found.tp_dim else mesh
            done = tp_mirror.mirror(model, dict(self.found.tp), self.found.tp_degree or 1, mesh)
            words.append("TP'd linears split as yours: " + ", ".join(f"{n} ({k})" for n, k in done))
        eager = self.config.compile.twin == "eager"
        kept = [] if eager else self.checkpoint_under_compile(model)
        if kept:
            words.append(
                f"activation checkpointing kept (replaying the RNG) on {', '.join(kept)}: compiled with it, "
                "a checkpointed region's backward is generated otherwise than without"
            )
        if self.found.compiled and eager:
            words.append(
                "eager: your compiles not mirrored (compile_twin='eager'), so compile's own difference shows"
            )
        elif self.found.compiled:
            compiling.settle()
            for spec in self.found.compiled:
                if spec.around_ddp:
                    continue  # compiled around the twin's DDP (``UserDDP.wrap``)
                module = model.get_submodule(spec.module) if spec.module else model
                module.compile(backend=spec.backend, fullgraph=spec.fullgraph, dynamic=spec.dynamic)
            words.append(f"{len(self.found.compiled)} modules compiled as yours")
            self.compile_backend = self.found.compiled[0].backend_name
            self.compiled_count = len(self.found.compiled)
        if self.found.checkpointed and not kept:
            words.append("no activation checkpointing (a correct recompute is the forward)")
            self.recorded_checkpoint = "replay"  # what a recompute replaying the RNG computes
        self.description = "; ".join(words) + f"; {self.description}"  # type: ignore[has-type]


class UserMirrored(_Twin, MirroredDDP):
    """The float32 twin: gradients reduced by hand as the function's units reduce them."""

    def __init__(self, config: ParityConfig, device: torch.device, found: Found) -> None:
        self.found = found
        super().__init__(config, device)
        self.description = (
            "float32, gradients reduced by hand through your units' collectives on their buckets"
        )

    def _layout_of(self, config: ParityConfig) -> reduce_layout.Layout | None:
        return self.user_layout(self.trained_module())

    def candidate_layout(self) -> reduce_layout.Layout:
        return self.user_layout(self.trained_module())


class UserLowPrecision(_Twin, LowPrecisionDDP):
    """The low-precision twin: each unit's policy emulated on a working copy (``policies.py``),
    float32 masters."""

    def __init__(self, config: ParityConfig, device: torch.device, found: Found) -> None:
        self.found = found
        self.found_policy = the_policy(found, config)
        super().__init__(config, device)
        kinds = sorted({f"{p.param}/{p.reduce_dtype}" for p in found.policies() if p is not None})
        self.description = (
            f"a working copy in your units' policies ({', '.join(kinds)}: parameter/reduce dtypes) "
            "with float32 masters, gradients reduced by hand through their collectives on their buckets"
        )

    def candidate_policy(self, config: ParityConfig) -> PrecisionPolicy | None:  # type: ignore[override]
        return self.found_policy

    def wrap(self, module: nn.Module) -> nn.Module:
        self.working = policies.working_copy(module, self.found)
        policies.install_casts(self.working, self.found)
        self.layout = self.candidate_layout()
        return Engine.wrap(self, self.working)

    def after_backward(self) -> None:
        policies.reduce_by_dtype(
            self.layout,
            list(self.working.named_parameters()),
            list(self.module.parameters()),
            self.found,
            self.config.mesh.data_parallel_size(self.config.world_size),
            in_reverse=self.summed_in_reverse,
        )

    def candidate_layout(self) -> reduce_layout.Layout:
        return self.user_layout(self.trained_module())


class UserDDP(_Twin, Engine):
    """The twin of a function that wraps the root in DDP: DDP itself (its reducer is the
    candidate's), with the candidate's bucket size and compiles, without its checkpointing."""

    reduces_itself = True

    def __init__(self, config: ParityConfig, device: torch.device, found: Found) -> None:
        self.found = found
        super().__init__(config, device)
        self.description = "DDP"

    def wrap(self, module: nn.Module) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [self.device.index] if self.device.type == "cuda" else None
        wrapped = DDP(module, device_ids=ids, bucket_cap_mb=self.found.ddp["bucket_cap_mb"])  # type: ignore[index]
        for spec in self.found.compiled:
            if spec.around_ddp and self.config.compile.twin != "eager":  # the same graph split, buckets
                compiling.settle()
                return torch.compile(
                    wrapped, backend=spec.backend, fullgraph=spec.fullgraph, dynamic=spec.dynamic
                )
        return wrapped


def build(config: ParityConfig, device: torch.device) -> Engine:
    """The twin of the workload's function (a ValueError naming what it cannot mirror)."""
    found = found_by_twin(config, device)
    if found.refused:
        raise ValueError(
            "the twin cannot mirror what your parallelize function did: " + "; ".join(found.refused)
        )
    cls: type[_Twin] = UserDDP
    if found.ddp is None:
        cls = UserLowPrecision if the_policy(found, config) is not None else UserMirrored
    engine = cls(config, device, found)  # type: ignore[call-arg]
    engine.mirror_function()
    return engine  # type: ignore[return-value]
