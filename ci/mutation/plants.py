"""The bug classes the mutation check plants into a copy of ``scaler/`` (and, from
``engine_plants.py``, of the parity engine ``harness/parity/``), one precise edit each.

Why precise text edits rather than a generic mutator: each plant is a bug someone could really
write (most are bugs torch's own scalers have or had), and each must stay what it says. An edit
names the exact text it replaces; if that text is no longer in the file exactly once, applying the
plant raises :class:`PlantError` naming the plant, so a refactor of ``scaler/`` can never turn the
check into one that silently tests nothing.

Each plant also names the tests the gate runs against it (``tests``: pytest paths or node ids):
the ones that kill it, so the whole check takes minutes. A plant that survives is a hole in the
suites: write the test that kills it and add it here.
"""

from __future__ import annotations

from ci.mutation.cost_plants import COST_PLANTS
from ci.mutation.edits import Edit, Plant, PlantError, apply
from ci.mutation.engine_plants import ENGINE_PLANTS
from ci.mutation.pair_plants import PAIR_PLANTS
from ci.mutation.pipeline_plants import PIPELINE_PLANTS
from ci.mutation.premise_plants import PREMISE_PLANTS
from ci.mutation.resume_plants import RESUME_PLANTS
from ci.mutation.semantics_plants import SEMANTICS_PLANTS
from ci.mutation.staged_plants import STAGED_PLANTS
from ci.mutation.two_d_plants import TWO_D_PLANTS
from ci.mutation.user_plants import USER_PLANTS
from ci.mutation.world_size_plants import WORLD_SIZE_PLANTS
from harness.parity.plan.matrices import default as matrix

__all__ = ["PLANTS", "Edit", "Plant", "PlantError", "apply"]


_SHARDED_DIST = "suites/scaler/test_sharded_distributed.py"
_LOCAL = "suites/scaler/test_sharded_local.py"
_RULE = "suites/scaler/test_rule.py"
_DIFF = "suites/scaler/test_grad_scaler_differential.py"
_SPARSE = "suites/scaler/test_sparse_grads.py"
_DROP_IN = "suites/scaler/test_sharded_drop_in.py"
_API = "suites/scaler/test_grad_scaler_api.py"
_FORCED_INF = "suites/parity/test_forced_inf.py"
_POISONED = f"{_FORCED_INF}::test_the_run_matches_the_reference_where_every_rank_was_poisoned"
_RECORDS = "suites/scaler/test_optimizer_records.py"


def _forced_inf(engine: str, optimizer: str, path: str = "plain", *, every_rank: bool = False) -> str:
    """The id of the forced-inf configuration (inf, not NaN) with these fields, looked up in the
    matrix: ids name the steps the faults hit, which the matrix may change."""
    (config,) = [
        c
        for c in matrix.forced_inf()
        if (c.engine, c.optimizer, c.loop.path) == (engine, optimizer, path)
        and all(f.value == "inf" and (f.rank is None) == every_rank for f in c.faults)
    ]
    return config.id


_SGD_ONE_RANK = f"{_POISONED}[{_forced_inf('ddp', 'sgd')}]"
"""A parity configuration (DDP, inf on rank 1): its test and its golden curves."""
_FUSED_ONE_RANK = f"{_POISONED}[{_forced_inf('fsdp1', 'adam_fused')}]"
_TWO_OPTIMIZERS = f"{_POISONED}[{_forced_inf('fsdp2', 'sgd', 'two_optimizers', every_rank=True)}]"
_FSDP2 = "suites/parity/test_fsdp_vs_ddp.py::test_fsdp_trains_like_ddp[fsdp2-reshard-fp32-sgd-w2]"

_SCALER_PLANTS: tuple[Plant, ...] = (
    Plant(
        name="no_agreement",
        bug="found_inf is never all-reduced: each rank decides on its own grads",
        edits=(
            Edit(
                file="_sharded.py",
                old="        dist.all_reduce(combined, op=dist.ReduceOp.MAX, group=group)\n",
                new="        pass  # planted: no cross-rank agreement\n",
            ),
        ),
        tests=(_SHARDED_DIST, _SGD_ONE_RANK),
    ),
    Plant(
        name="sum_for_max",
        bug="found_inf agreed with SUM: two overflowing ranks give 2.0, which fused kernels do not skip on",
        edits=(
            Edit(
                file="_sharded.py",
                old="op=dist.ReduceOp.MAX, group=group)",
                new="op=dist.ReduceOp.SUM, group=group)  # planted",
            ),
        ),
        tests=(_SHARDED_DIST,),
    ),
    Plant(
        name="no_backoff",
        bug="an overflow resets the tracker but leaves the scale where it was",
        edits=(
            Edit(
                file="_rule.py",
                old="config.growth_factor, config.backoff_factor, config.growth_interval",
                new="config.growth_factor, 1.0, config.growth_interval  # planted",
            ),
        ),
        tests=(_RULE, _LOCAL, _SGD_ONE_RANK),
    ),
    Plant(
        name="growth_interval_off_by_one",
        bug="the scale grows after growth_interval + 1 clean steps",
        edits=(
            Edit(
                file="_rule.py",
                old="config.growth_factor, config.backoff_factor, config.growth_interval",
                new="config.growth_factor, config.backoff_factor, config.growth_interval + 1  # planted",
            ),
        ),
        tests=(_RULE, _LOCAL, _SGD_ONE_RANK),
    ),
    Plant(
        name="growth_past_float32",
        bug="the rule re-implemented in Python without the finiteness check: the scale grows to +inf",
        edits=(
            Edit(
                file="_rule.py",
                old=(
                    "    torch._amp_update_scale_(\n"
                    "        scale, growth_tracker, found_inf, config.growth_factor, config.backoff_factor, "
                    "config.growth_interval\n"
                    "    )\n"
                ),
                new=(
                    "    if found_inf.item():  # planted: torch's sharded CPU update, no finiteness check\n"
                    "        scale.mul_(config.backoff_factor)\n"
                    "        growth_tracker.zero_()\n"
                    "    else:\n"
                    "        growth_tracker.add_(1)\n"
                    "        if growth_tracker.item() == config.growth_interval:\n"
                    "            scale.mul_(config.growth_factor)\n"
                    "            growth_tracker.zero_()\n"
                ),
            ),
        ),
        tests=(_RULE, _LOCAL),
    ),
    Plant(
        name="fp16_sparse_not_coalesced",
        bug="an uncoalesced fp16 sparse grad is checked value by value: duplicates summing past fp16 pass",
        edits=(
            Edit(
                file="_unscale.py",
                old="                        param.grad = grad = coalesce_fp16(grad)\n",
                new="                        pass  # planted: fp16 sparse grads checked uncoalesced\n",
            ),
        ),
        tests=(_SPARSE, _LOCAL),
    ),
    Plant(
        name="fp32_bf16_sparse_not_coalesced",
        bug="uncoalesced fp32/bf16 sparse duplicates are not checked as their sums (torch's behaviour)",
        edits=(
            Edit(
                file="_unscale.py",
                old=(
                    "                        summed = grad.coalesce()._values()\n"
                    "                        buckets[summed.device, summed.dtype].append(summed)\n"
                ),
                new="                        pass  # planted: duplicates checked one by one\n",
            ),
        ),
        tests=(_SPARSE, "suites/parity/test_sparse.py"),
    ),
    Plant(
        name="fused_not_agreed",
        bug="the fused-optimizer path checks its grads but never agrees found_inf (torch's bug)",
        edits=(
            Edit(
                file="_grad_scaler.py",
                old=(
                    "            self._check_inf_per_device(optimizer)\n"
                    "            self._agree_found_inf(record)\n"
                ),
                new="            self._check_inf_per_device(optimizer)  # planted: no agreement\n",
            ),
        ),
        tests=(_SHARDED_DIST, _FUSED_ONE_RANK),
    ),
    Plant(
        name="fused_no_inf_check",
        bug="the fused path hands the optimizer a found_inf of 0.0 without looking at the grads",
        edits=(
            Edit(
                file="_grad_scaler.py",
                old='        record["found_inf_per_device"] = self._unscale_grads(optimizer, one, fresh_flag, True)\n',
                new='        record["found_inf_per_device"] = {scale.device: fresh_flag(scale.device)}  # planted\n',
            ),
        ),
        tests=(_LOCAL, _DIFF),
    ),
    Plant(
        name="unscale_by_the_scale",
        bug="grads are multiplied by the scale instead of its inverse",
        edits=(
            Edit(
                file="_grad_scaler.py",
                old="            return scale.double().reciprocal().float()\n",
                new="            return scale.double().float()  # planted\n",
            ),
            Edit(
                file="_grad_scaler.py",
                old="        return inv_scale.fill_(1.0 / value)\n",
                new="        return inv_scale.fill_(value)  # planted\n",
            ),
        ),
        tests=(_DIFF, _LOCAL, _SGD_ONE_RANK),
    ),
    Plant(
        name="inv_scale_kept_after_the_scale_moved",
        bug="the CPU inverse scale is computed once and reused after a backoff or growth",
        edits=(
            Edit(
                file="_grad_scaler.py",
                old="        elif value == self._inv_scale_of:\n",
                new="        elif self._inv_scale_of is not None:  # planted: stale inverse\n",
            ),
        ),
        tests=(_DIFF, _LOCAL),
    ),
    Plant(
        name="sparse_unchecked_across_groups",
        bug="a sparse grad is not looked for up front when grads span several dtypes: one group is "
        "unscaled, the kernel refuses the sparse one's group, and the fallback unscales the first again",
        edits=(
            Edit(
                file="_unscale.py",
                old="        if len(grouped) == 1 or not any(map(_IS_SPARSE, grads)):\n",
                new="        if True:  # planted: no sparse check\n",
            ),
        ),
        tests=(_SPARSE,),
    ),
    Plant(
        name="growths_uncounted_on_host",
        bug="on a CPU scale the tracker resets are never counted, so growths() goes negative",
        edits=(
            Edit(
                file="_sharded.py",
                old="            self._resets_on_host += tracker.item() == 0\n",
                new="            self._resets_on_host += 0  # planted: dead counter\n",
            ),
        ),
        tests=(_LOCAL,),
    ),
    Plant(
        name="bounds_ignored",
        bug="min_scale and max_scale are accepted and then ignored",
        edits=(
            Edit(
                file="_rule.py",
                old=(
                    "    if config.min_scale is not None or config.max_scale is not None:\n"
                    "        scale.clamp_(min=config.min_scale, max=config.max_scale)\n"
                ),
                new="    pass  # planted: bounds ignored\n",
            ),
        ),
        tests=(_RULE, _LOCAL),
    ),
    Plant(
        name="load_state_dict_drops_tracker",
        bug="load_state_dict into a scaler that has stepped restores the scale but keeps the old tracker",
        edits=(
            Edit(
                file="_checkpoint.py",
                old=(
                    "        if self._growth_tracker is not None:\n"
                    "            self._growth_tracker.fill_(self._init_growth_tracker)\n"
                ),
                new="        pass  # planted: the live tracker is not restored\n",
            ),
        ),
        tests=(_DIFF, _LOCAL),
    ),
    Plant(
        name="dead_skip_counter",
        bug="skipped_steps never counts: neither host-decided nor fused (on-device) skips",
        edits=(
            Edit(
                file="_sharded.py",
                old="            self._skipped_on_host += skipped\n",
                new="            self._skipped_on_host += 0  # planted: dead counter\n",
            ),
            Edit(
                file="_sharded.py",
                old='            self._counter("skipped_steps").add_(flag)\n',
                new='            self._counter("skipped_steps")  # planted: dead counter\n',
            ),
        ),
        tests=(
            _LOCAL,
            f"{_FORCED_INF}::test_counters_agree_on_every_rank[{_forced_inf('ddp', 'sgd')}]",
        ),
    ),
    Plant(
        name="fp16_grads_unchecked",
        bug="fp16 grads are unscaled, but their inf/NaN never reach found_inf",
        edits=(
            Edit(
                file="_unscale.py",
                old="            torch._amp_foreach_non_finite_check_and_unscale_(grads, flag, inv)\n",
                new=(
                    "            checked = flag if grads[0].dtype != torch.float16 else torch.zeros_like(flag)  # planted\n"
                    "            torch._amp_foreach_non_finite_check_and_unscale_(grads, checked, inv)\n"
                ),
            ),
        ),
        tests=(_LOCAL, _SPARSE),
    ),
    Plant(
        name="dtensor_grads_not_local",
        bug="DTensor grads are unscaled as DTensors: DTensor dispatch adds its own reduction per bucket",
        edits=(
            Edit(
                file="_unscale.py",
                old=(
                    "            if type(grad) is not torch.Tensor and local_dtensor and DTensor is not None:\n"
                    "                if isinstance(grad, DTensor):\n"
                    "                    grad = grad.to_local()\n"
                ),
                new="            pass  # planted: DTensor grads kept as DTensors\n",
            ),
        ),
        tests=(_SHARDED_DIST, _FSDP2),
    ),
    Plant(
        name="fused_grad_scale_factor_dropped",
        bug="a fused optimizer's own grad_scale is overwritten by the scale instead of multiplied in",
        edits=(
            Edit(
                file="_fused.py",
                old="        optimizer.grad_scale = scale if outer is None else scale * outer  # type: ignore[attr-defined]\n",
                new="        optimizer.grad_scale = scale  # type: ignore[attr-defined]  # planted\n",
            ),
        ),
        tests=(_DIFF, "suites/scaler/test_sharded_optimizer.py"),
    ),
    Plant(
        name="records_not_kept",
        bug="per-optimizer records are made afresh on every access: unscale_ twice goes unnoticed",
        edits=(
            Edit(
                file="_records.py",
                old='        record = self[key] = {"stage": _READY, "found_inf_per_device": {}}\n',
                new='        record = {"stage": _READY, "found_inf_per_device": {}}  # planted\n',
            ),
        ),
        tests=(_DIFF, _API),
    ),
    Plant(
        name="rule_not_pure",
        bug="next_scale_state advances the state it was given instead of returning a new one",
        edits=(
            Edit(
                file="_rule.py",
                old="    scale, tracker = state.scale.clone(), state.growth_tracker.clone()\n",
                new="    scale, tracker = state.scale, state.growth_tracker  # planted\n",
            ),
        ),
        tests=(_RULE,),
    ),
    Plant(
        name="two_optimizers_flag_not_clamped",
        bug="two optimizers overflowing together count as two backoffs (their flags summed, not clamped)",
        edits=(
            Edit(
                file="_sharded.py",
                old="        return found if len(self._per_optimizer_states) == 1 else found.clamp(max=1.0)\n",
                new="        return found  # planted\n",
            ),
        ),
        tests=(_LOCAL, _TWO_OPTIMIZERS),
    ),
    Plant(
        name="scale_changes_output_dtype",
        bug="ShardedGradScaler.scale returns float32 for an fp16 loss (torch's keeps the dtype)",
        edits=(
            Edit(
                file="_outputs.py",
                old="        return scaled.type(outputs.dtype) if keep_dtype else scaled\n",
                new="        return scaled  # planted\n",
            ),
        ),
        tests=(_DROP_IN,),
    ),
    Plant(
        name="records_hold_a_private_enum",
        bug="per-optimizer records hold a stage enum of our own, never equal to torch's OptState",
        edits=(
            Edit(
                file="_records.py",
                old="from torch.amp.grad_scaler import OptState\n",
                new=(
                    "from enum import Enum\n\n\n"
                    "class OptState(Enum):  # planted: a private enum\n"
                    "    READY = 0\n    UNSCALED = 1\n    STEPPED = 2\n"
                ),
            ),
        ),
        tests=(f"{_RECORDS}::test_a_fresh_record_equals_torchs_fresh_record_before_and_after_pickling",),
    ),
    Plant(
        name="records_hold_an_extra_key",
        bug="ShardedGradScaler keeps its host skip decision in the record, a key torch's records lack",
        edits=(
            Edit(
                file="_sharded.py",
                old="        self._host_skips[id(optimizer)] = skipped = bool(flag.item())  # the sync torch's path makes too\n",
                new=(
                    "        self._host_skips[id(optimizer)] = skipped = bool(flag.item())\n"
                    '        record["skipped"] = skipped  # planted: an extra key\n'
                ),
            ),
        ),
        tests=(f"{_RECORDS}::test_records_after_unscale_and_step_equal_torchs",),
    ),
)

PLANTS: tuple[Plant, ...] = (
    *_SCALER_PLANTS,
    *ENGINE_PLANTS,
    *WORLD_SIZE_PLANTS,
    *STAGED_PLANTS,
    *PREMISE_PLANTS,
    *RESUME_PLANTS,
    *TWO_D_PLANTS,
    *PIPELINE_PLANTS,
    *SEMANTICS_PLANTS,
    *USER_PLANTS,
    *COST_PLANTS,
    *PAIR_PLANTS,
)
"""Every plant: the scaler's, then the parity engine's."""
