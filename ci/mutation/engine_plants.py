"""Plants in the parity engine (``harness/parity/``): verdicts that would lie.

Why the engine too: a parity tool that passes a broken configuration is worse than none, and the
checks it claims to make (ranks agreeing, the scaler state against the reference, every rank's
loss, gradients, parameters, optimizer state, buffers, ``exact`` being bitwise) are code that a
refactor can loosen without any scaler test noticing. Each plant removes or loosens one check,
or misplaces what the report says, and names the hand-made-record tests that must catch it (they
need no ranks, so most of these mutants cost seconds); the localization plants also run the
planted-bug tests of ``suites/parity/test_localize.py``.
"""

from __future__ import annotations

from ci.mutation.edits import Edit, Plant

_PARITY = "harness/parity"
_CHECKS = "suites/parity/test_checks.py"
_TWO_D = "suites/parity/test_two_d.py"
_COMPARE = "suites/parity/test_compare.py"
_ULP = "suites/parity/test_ulp.py"
_CAUSES = "suites/parity/test_causes.py"
_REPORT = "suites/parity/test_report.py"
_LOCALIZE = "suites/parity/test_localize.py"
_POLICY = "suites/parity/test_reference_policy.py"
_REUSE = "suites/parity/test_reuse.py"
_GATHER = "suites/parity/test_gather_layout.py"
_STEPCHECK = "suites/parity/test_stepcheck.py"
_RECIPES = "suites/parity/test_recipes.py"
_RECIPE_PARITY = "suites/parity/test_recipe_parity.py"
_CLIP = "suites/parity/test_clip_norm.py"
_ACCUMULATE = "suites/parity/test_accumulate.py"
_CHECKPOINT = "suites/parity/test_checkpoint.py"
_COMPILE = "suites/parity/test_compile.py"
_EVERY_ELEMENT = "suites/parity/test_every_element_judged.py"
_FUSED = "suites/parity/test_fused_optimizer.py"
"""The judge's property (its fixed sample): a moved element of any kind, anywhere, is seen."""


def _edit(file: str, old: str, new: str) -> Edit:
    return Edit(file=file, old=old, new=new, package=_PARITY)


ENGINE_PLANTS: tuple[Plant, ...] = (
    Plant(
        name="parity_ranks_not_checked_for_agreement",
        bug="the candidate's ranks are never checked against each other (found_inf, skips, scale)",
        edits=(
            _edit(
                "judge/compare.py",
                'found: list[tuple[str, str]] = [("agreement", text) for text in _same_on_every_rank(cand)]',
                "found: list[tuple[str, str]] = []  # planted",
            ),
        ),
        tests=(_CHECKS, _COMPARE),
    ),
    Plant(
        name="parity_scaler_state_not_checked",
        bug="skip decisions, found_inf, scale and tracker are not compared with the reference",
        edits=(
            _edit(
                "judge/compare.py", "        found += _scaler_state(ref, cand)\n", "        pass  # planted\n"
            ),
        ),
        tests=(_CHECKS, _COMPARE),
    ),
    Plant(
        name="parity_loss_of_rank_0_only",
        bug="only rank 0's loss is compared",
        edits=(
            _edit(
                "judge/compare.py",
                "    for rank, (want, got) in enumerate(zip(ref.losses, cand.losses, strict=True)):\n",
                "    for rank, (want, got) in enumerate(zip(ref.losses[:1], cand.losses[:1], strict=True)):  # planted\n",
            ),
        ),
        tests=(_CHECKS, _COMPARE, _EVERY_ELEMENT),
    ),
    Plant(
        name="parity_grads_not_compared",
        bug="gradients are not compared",
        edits=(
            _edit(
                "judge/compare.py",
                '_TENSOR_KINDS = ("grad", "param", "optim_state")',
                '_TENSOR_KINDS = ("param", "optim_state")  # planted',
            ),
        ),
        tests=(_CHECKS, _EVERY_ELEMENT),
    ),
    Plant(
        name="parity_params_not_compared",
        bug="parameters are not compared",
        edits=(
            _edit(
                "judge/compare.py",
                '_TENSOR_KINDS = ("grad", "param", "optim_state")',
                '_TENSOR_KINDS = ("grad", "optim_state")  # planted',
            ),
        ),
        tests=(_CHECKS, _COMPARE, _EVERY_ELEMENT),
    ),
    Plant(
        name="parity_optim_state_not_compared",
        bug="optimizer state is not compared",
        edits=(
            _edit(
                "judge/compare.py",
                '_TENSOR_KINDS = ("grad", "param", "optim_state")',
                '_TENSOR_KINDS = ("grad", "param")  # planted',
            ),
        ),
        tests=(_CHECKS, _EVERY_ELEMENT),
    ),
    Plant(
        name="parity_buffers_not_compared",
        bug="module buffers are recorded but not compared",
        edits=(
            _edit(
                "judge/compare.py",
                '        tensor_found, diffs = _tensor_problems(ref, cand, profile, (*kinds, "buffer"))\n',
                "        tensor_found, diffs = _tensor_problems(ref, cand, profile, kinds)  # planted\n",
            ),
        ),
        tests=(_CHECKS, _CAUSES, _EVERY_ELEMENT),
    ),
    Plant(
        name="parity_exact_not_bitwise",
        bug="the exact profile compares in float16, so float32 values a few ulps apart pass as equal",
        edits=(
            _edit(
                "ranks/measure/distance.py",
                "same = (ref == cand) | both_nan",
                "same = (ref.half() == cand.half()) | both_nan  # planted",
            ),
        ),
        tests=(_CHECKS, _ULP),
    ),
    Plant(
        name="parity_tolerance_loosened",
        bug="a toleranced profile allows ten times its rtol/atol",
        edits=(
            _edit(
                "ranks/measure/distance.py",
                "close = (c - r).abs() <= profile.atol + profile.rtol * r.abs()",
                "close = (c - r).abs() <= 10 * (profile.atol + profile.rtol * r.abs())  # planted",
            ),
        ),
        tests=(_CHECKS,),
    ),
    Plant(
        name="parity_one_ulp_labelled_bitwise",
        bug="a configuration 1 ulp from its reference is labelled bitwise",
        edits=(_edit("ranks/measure/ulp.py", "    if max_ulp == 0:\n", "    if max_ulp <= 1:  # planted\n"),),
        tests=(_ULP,),
    ),
    Plant(
        name="parity_verdict_reads_step_0_only",
        bug="a configuration whose first divergence comes after step 0 is reported as a pass",
        edits=(
            _edit(
                "judge/result.py",
                '    status = "pass" if comparison.ok else ("crash" if candidate.error else "fail")\n',
                '    status = "pass" if comparison.ok or comparison.first.step > 0 else "fail"  # planted\n',
            ),
        ),
        tests=(_REPORT, _LOCALIZE),
    ),
    Plant(
        name="parity_last_module_named",
        bug="localization names the last diverging module instead of the first",
        edits=(
            _edit(
                "judge/pinpoint.py",
                "    first = min(failing, key=lambda m: (PHASES.index(m.phase), m.order, m.rank), default=None)\n",
                "    first = max(failing, key=lambda m: (PHASES.index(m.phase), m.order, m.rank), default=None)  # planted\n",
            ),
        ),
        tests=(_LOCALIZE,),
    ),
    Plant(
        name="parity_backward_localized_first",
        bug="localization looks at gradients before forward outputs, blaming a module downstream",
        edits=(
            _edit(
                "judge/pinpoint.py",
                'PHASES = ("forward", "backward")',
                'PHASES = ("backward", "forward")  # planted',
            ),
        ),
        tests=(_LOCALIZE,),
    ),
    Plant(
        name="parity_op_never_diverges",
        bug="inside the first diverging module, no op is ever found to differ",
        edits=(
            _edit(
                "judge/pinpoint.py",
                "        if diff.mismatched:\n            return OpFinding(",
                "        if diff.mismatched > diff.numel:  # planted\n            return OpFinding(",
            ),
        ),
        tests=(_LOCALIZE,),
    ),
    Plant(
        name="parity_causes_silent",
        bug="no known cause is ever matched",
        edits=(
            _edit(
                "judge/causes/__init__.py",
                "    found = [known.weigh(evidence) for known in CATALOGUE]\n",
                "    found = []  # planted\n",
            ),
        ),
        tests=(_CAUSES, _LOCALIZE),
    ),
    Plant(
        name="parity_dtensor_shape_inferred",
        bug="the zero placeholder of missing optimizer state (fp16 skipped the first steps) lets "
        "DTensor.from_local infer its global shape from the local shard: rows that do not divide by "
        "the world size give each rank its own shape, the gather's sizes differ and gloo aborts a rank",
        edits=(
            _edit(
                "ranks/sides/full/gather.py",
                "        run_check=False,\n        shape=param.shape,\n        stride=param.stride(),\n",
                "        run_check=False,  # planted: shape and stride inferred from the local shard\n",
            ),
        ),
        tests=("suites/parity/test_uneven.py", "suites/parity/test_engines.py"),
    ),
    Plant(
        name="parity_reference_casts_buffers",
        bug="the low-precision reference casts every buffer to the parameter dtype, whatever the "
        "candidate's policy (FSDP2 keeps buffers as they were: a rotary inv_freq stays float32)",
        edits=(
            _edit(
                "ranks/sides/twin.py",
                "param, buffers = dtype(policy.param), dtype(policy.buffers)\n",
                "param, buffers = dtype(policy.param), dtype(policy.buffers) or dtype(policy.param)  # planted\n",
            ),
        ),
        tests=(_POLICY,),
    ),
    Plant(
        name="parity_reference_divides_as_ddp",
        bug="the low-precision reference divides its gradient sum by the world size first, as DDP "
        "does, not by its candidate's pre/post factors: at world size 4 FSDP's fp16 sum of halves "
        "overflows where the reference's sum of quarters does not",
        edits=(
            _edit(
                "ranks/sides/references.py",
                "        factors = twin.divide_factors(\n            self.config.engine,\n",
                '        factors = twin.divide_factors(\n            "ddp",  # planted\n',
            ),
        ),
        tests=(
            "suites/parity/test_divide_factors.py::"
            "test_fp16_on_four_ranks_overflows_in_the_reference_where_fsdp_does",
        ),
    ),
    Plant(
        name="parity_reduce_order_blamed_at_two_ranks",
        bug="a low-precision gradient difference at world size 2 (where two addends commute and "
        "the reference is bitwise) is excused as summation order",
        edits=(
            _edit(
                "judge/causes/rounding.py",
                "or e.world_size <= 2 or e.origin is None:\n",
                "or e.world_size < 2 or e.origin is None:  # planted\n",
            ),
        ),
        tests=(_CAUSES,),
    ),
    Plant(
        name="parity_noise_gradient_ignores_the_gradient",
        bug="any parameter that moved apart is blamed on a noise gradient, whatever its gradient",
        edits=(
            _edit(
                "judge/causes/rounding.py",
                "any(norms.get(name, largest) > 1e-6 * largest for name in moved):\n",
                "any(False for name in moved):  # planted\n",
            ),
        ),
        tests=(_CAUSES,),
    ),
    Plant(
        name="parity_figure_hides_the_cause",
        bug="the figure's panel of a broken row shows only its id, so a rounding row (reduce_order) "
        "looks like a sharding mistake unless the reader opens parity.md",
        edits=(
            _edit(
                "report/plot.py",
                "    if not r.causes:\n        return r.config.id + expected\n",
                "    if True:  # planted\n        return r.config.id + expected\n",
            ),
        ),
        tests=(f"{_REPORT}::test_a_broken_rows_panel_names_its_known_causes",),
    ),
    Plant(
        name="parity_reference_on_other_shapes",
        bug="the single-process sparse reference multiplies every rank's rows at once: another kernel "
        "path than a rank's own, bitwise on some CPUs only (a verdict that depends on the machine)",
        edits=(
            _edit(
                "workload/builtin/toys.py",
                '        ((part.clone().float() @ projection) * batch["coefficient"]).sum()\n'
                "        for part, batch in zip(parts, batches, strict=True)\n",
                '        (part * batch["coefficient"]).sum()  # planted\n'
                '        for part, batch in zip((rows.float() @ projection).split([len(b["indices"]) '
                "for b in batches]), batches, strict=True)\n",
            ),
        ),
        tests=(  # the kernel-family run that found it is an end-to-end test now (make e2e, make kernels)
            "suites/parity/test_sparse.py::"
            "test_the_single_process_reference_multiplies_each_ranks_rows_in_that_ranks_own_shape",
        ),
    ),
    Plant(
        name="parity_reuse_shares_unequal_tensors",
        bug="a candidate tensor that differs from the reference's is replaced by the reference's "
        "(the shape and dtype checked, the values not): every differing tensor would compare equal",
        edits=(
            _edit(
                "ranks/sides/full/reuse.py",
                "        and torch.equal(want, got)\n",
                "        # planted: values not compared\n",
            ),
        ),
        tests=(_REUSE,),
    ),
    Plant(
        name="parity_gather_carrier_not_agreed",
        bug="every gather travels in float32 whatever the tensors' dtypes: float64 values "
        "(a mixed-dtype batch) would be rounded before they are compared",
        edits=(
            _edit(
                "ranks/sides/full/gather.py",
                "    return torch.float32 if dtypes == {torch.float32} else torch.float64\n",
                "    return torch.float32  # planted\n",
            ),
        ),
        tests=(_GATHER,),
    ),
    Plant(
        name="parity_replicas_compared_twice",
        bug="every rank compares a replicated candidate's elements (FSDP1 NO_SHARD): each element "
        "is counted once per rank, and a replica that differs on rank 1 only would be judged by "
        "another rank's numbers than the gather onto rank 0 shows",
        edits=(
            _edit(
                "ranks/measure/local.py",
                "    if not fsdp1.is_sharded(unit.module):\n        return _rank() == 0\n",
                "    if not fsdp1.is_sharded(unit.module):\n        return True  # planted\n",
            ),
        ),
        tests=(_STEPCHECK, _EVERY_ELEMENT),
    ),
    Plant(
        name="parity_shard_compared_with_the_first_rows",
        bug="each rank compares its FSDP2 shard with the reference's first rows instead of the "
        "rows it holds: every rank but 0 measures the wrong elements",
        edits=(
            _edit(
                "ranks/measure/local.py",
                "    start = min(mesh_rank * chunk, shape[0] if shape else 0) * row\n",
                "    start = 0  # planted\n",
            ),
        ),
        tests=(_STEPCHECK, _EVERY_ELEMENT),
    ),
    Plant(
        name="parity_rank_buffers_not_compared",
        bug="the module buffers each rank records are never compared on the ranks: no distance is "
        "sent for them, and the judge reads a buffer without one as equal",
        edits=(
            _edit(
                "ranks/measure/stepcheck.py",
                '        measured["buffer"] = compared.compare(\n'
                "            own_buffers(reference.buffers, self.rank), own, self.profile, align=True\n"
                "        )\n",
                '        measured["buffer"] = compared.Measured()  # planted\n',
            ),
        ),
        tests=(_EVERY_ELEMENT,),
    ),
    Plant(
        name="parity_piece_last_element_not_compared",
        bug="each rank compares its piece of every tensor but the piece's last element: the edge "
        "of a shard (next to padding, the last row of an uneven split, the end of a parameter "
        "inside a flat shard) is never judged",
        edits=(
            _edit(
                "ranks/measure/compared.py",
                '        got = piece.values.to("cpu", dtype)\n',
                '        got = piece.values.to("cpu", dtype)[:-1]  # planted\n',
            ),
        ),
        tests=(_EVERY_ELEMENT,),
    ),
    Plant(
        name="parity_lockstep_reference_kept_whole",
        bug="a reference too large to keep is kept step after step anyway: rank memory grows "
        "with the number of steps",
        edits=(
            _edit(
                "ranks/measure/stepcheck.py",
                "        self._drops = live is not None\n",
                "        self._drops = False  # planted\n",
            ),
        ),
        tests=(_STEPCHECK,),
    ),
    Plant(
        name="parity_origin_tensors_not_sent",
        bug="the full tensors of the step whose gradients first differ do not travel: a rounding "
        "difference that grows past the profile later can no longer be traced to where it began",
        edits=(
            _edit(
                "ranks/measure/stepcheck.py",
                "        keep = self.keep_all or self._origin or (failed and not self._failure_found)\n",
                "        keep = self.keep_all or (failed and not self._failure_found)  # planted\n",
            ),
        ),
        tests=(_STEPCHECK,),
    ),
    Plant(
        name="parity_recipe_unnamed_in_ids",
        bug="an autocasting recipe's rows carry the ids of the pure rows of the same dtype (the "
        "report, -k and the gate's curves cannot tell them apart)",
        edits=(
            _edit(
                "plan/config/precision.py",
                "        parts = [self.recipe] if self.recipe in recipes.AUTOCASTING else []\n",
                "        parts = []  # planted\n",
            ),
        ),
        tests=(f"{_RECIPES}::test_a_recipe_beyond_pure_is_named_in_the_id",),
    ),
    Plant(
        name="parity_recipes_share_a_reference",
        bug="a mixed recipe shares the pure recipe's cached reference: its twin never autocasts",
        edits=(
            _edit(
                "plan/config/__init__.py",
                "            self.precision.autocast,\n",
                "            None,  # planted\n",
            ),
        ),
        tests=(f"{_RECIPES}::test_every_recipe_has_a_reference_of_its_own",),
    ),
    Plant(
        name="parity_autocast_reference_in_low_precision",
        bug="the autocast recipe's reference trains a low-precision working copy, though its "
        "candidate keeps float32 parameters",
        edits=(
            _edit(
                "ranks/sides/roles.py",
                "    elif config.policy is not None and not registry.get(config.workload).sparse:\n",
                '    elif config.precision.dtype != "fp32" and not registry.get(config.workload).sparse:  # planted\n',
            ),
        ),
        tests=(f"{_RECIPE_PARITY}::test_each_recipe_trains_like_its_twin_bitwise",),
    ),
    Plant(
        name="parity_loss_dtype_cause_silent",
        bug="a loss computed in float16 on one side only (a twin without the recipe's autocast) is "
        "never named",
        edits=(
            _edit(
                "judge/causes/forward.py", "pattern=loss_dtype_differs)", "pattern=lambda e: None)  # planted"
            ),
        ),
        tests=("suites/parity/test_recipe_causes.py",),
    ),
    Plant(
        name="parity_output_dtypes_not_localized",
        bug="the localization drops each module output's dtype, so a forgotten autocast is only "
        "'the forward differs'",
        edits=(
            _edit(
                "judge/pinpoint.py",
                "    dtypes = None if want.dtype == got.dtype else (short(want.dtype), short(got.dtype))\n",
                "    dtypes = None  # planted\n",
            ),
        ),
        tests=(f"{_RECIPE_PARITY}::test_the_forgotten_autocast_is_named_with_the_first_linears_dtypes",),
    ),
    Plant(
        name="parity_clip_norm_not_compared",
        bug="the total norm each rank's clip_grad_norm_ returned is recorded but never compared",
        edits=(
            _edit(
                "judge/compare.py",
                '            found += [("clip_norm", text) for text in clip_norm.problems(ref, cand, profile)]\n',
                "            pass  # planted\n",
            ),
        ),
        tests=(_CLIP, _EVERY_ELEMENT),
    ),
    Plant(
        name="parity_clip_norm_sharded_silent",
        bug="a rank that clipped with its own shard's norm as the total is never named",
        edits=(
            _edit(
                "judge/causes/loop.py",
                "        pattern=clip_norm_sharded,\n",
                "        pattern=lambda e: None,  # planted\n",
            ),
        ),
        tests=(_CLIP,),
    ),
    Plant(
        name="parity_clip_unscale_order_silent",
        bug="gradients clipped before unscale_, or unscaled twice, are only 'a clip norm that differs'",
        edits=(
            _edit(
                "judge/causes/loop.py",
                "        pattern=clip_unscale_order,\n",
                "        pattern=lambda e: None,  # planted\n",
            ),
        ),
        tests=(_CLIP,),
    ),
    Plant(
        name="parity_clip_max_norm_ignored",
        bug="the configured max norm is ignored: every run clips at 1.0, so a row said to clip at "
        "0.05 checks a clip that never bites",
        edits=(
            _edit(
                "ranks/train.py",
                "                clip_norm = engine.clip_grad_norm_(config.loop.clip)\n",
                "                clip_norm = engine.clip_grad_norm_(1.0)  # planted\n",
            ),
        ),
        tests=(f"{_CLIP}::test_the_optimizer_receives_gradients_clipped_to_the_configured_max_norm",),
    ),
    Plant(
        name="parity_accumulation_twin_syncs_every_microbatch",
        bug="the reference reduces every microbatch whatever the sync mode, so a candidate that "
        "accumulates unsynced gradients is judged against another sum",
        edits=(
            _edit(
                "ranks/sides/accumulate.py",
                '        if self.sync == "every":\n',
                "        if True:  # planted\n",
            ),
        ),
        tests=(f"{_ACCUMULATE}::test_fsdp_accumulating_microbatches_trains_bitwise_like_its_twin",),
    ),
    Plant(
        name="parity_accumulation_candidate_never_skips_the_sync",
        bug="the candidate reduces every microbatch on sync='last' (no no_sync()), so the rows "
        "said to accumulate unsynced check nothing of it",
        edits=(_edit("ranks/sides/accumulate.py", "    if sync:\n", "    if True:  # planted\n"),),
        tests=(f"{_ACCUMULATE}::test_fsdp_accumulating_microbatches_trains_bitwise_like_its_twin",),
    ),
    Plant(
        name="parity_accumulation_dtype_cause_silent",
        bug="a twin accumulating in another dtype than its candidate is never named",
        edits=(
            _edit(
                "judge/causes/loop.py",
                "        pattern=accumulation_dtype,\n",
                "        pattern=lambda e: None,  # planted\n",
            ),
        ),
        tests=(_ACCUMULATE,),
    ),
    Plant(
        name="parity_checkpoint_candidate_always_replays",
        bug="the candidate replays the RNG state whatever the configuration says, so the row said "
        "to checkpoint without replay checks a correct recompute",
        edits=(
            _edit(
                "ranks/sides/checkpoint.py",
                "    replay = replays(config, role)\n",
                '    replay = replays(config, "reference")  # planted\n',
            ),
        ),
        tests=(
            f"{_CHECKPOINT}::test_checkpointing_without_replay_under_dropout_fails_at_step_0_in_the_gradients",
        ),
    ),
    Plant(
        name="parity_compile_reference_left_eager",
        bug="the candidate is compiled and its twin is not, so a compiled row compares inductor's "
        "rounding with eager's (or, under aot_eager, passes without the twin it claims)",
        edits=(
            _edit(
                "ranks/sides/compiled.py",
                '    if part.mode is None or part.mode == "function":  # a user\'s function compiles itself (``user/``)\n        return\n    settle()\n',
                '    if part.mode is None or role == "reference":  # planted\n        return\n    settle()\n',
            ),
        ),
        tests=(f"{_COMPILE}::test_both_sides_ran_compiled_modules_and_say_what_it_cost",),
    ),
    Plant(
        name="parity_checkpoint_rng_cause_silent",
        bug="a recompute without RNG replay under dropout is never named",
        edits=(
            _edit(
                "judge/causes/loop.py",
                "        pattern=checkpoint_rng,\n",
                "        pattern=lambda e: None,  # planted\n",
            ),
        ),
        tests=(_CHECKPOINT,),
    ),
    Plant(
        name="parity_loop_features_never_combined",
        bug="a user who clips, accumulates and checkpoints gets one row per feature and never "
        "the three together, the loop they train with",
        edits=(
            _edit(
                "plan/matrices/loop.py",
                "    if sum([declared.clip is not None, declared.accumulates, declared.checkpoint]) < 2:\n        return []\n",
                "    if True:  # planted\n        return []\n",
            ),
        ),
        tests=("suites/parity/test_loop_declared.py",),
    ),
    Plant(
        name="parity_fused_reference_steps_whole_tensors",
        bug="a fused optimizer's reference steps whole parameters again, not the candidate's shards: "
        "an element its kernel rounds in the vector body on one side is in the scalar tail on the "
        "other, and the update is a last bit apart from the first step (what the fp32 fallback hid)",
        edits=(
            _edit(
                "ranks/sides/optim/step_pieces.py",
                '    if not optimizer.defaults.get("fused"):\n        return optimizer\n',
                "    if True:  # planted: whole tensors, as before the mirror\n        return optimizer\n",
            ),
        ),
        tests=(
            f"{_FUSED}::test_a_fused_adam_row_passes_bitwise_straight_through",
            "suites/parity/test_step_pieces.py::test_a_step_over_the_pieces_is_bitwise_a_fused_step_over_each_shard_alone",
        ),
    ),
    Plant(
        name="tp_partials_added_in_rank_order",
        bug="the TP twin adds its partial products in rank order instead of through the candidate's "
        "collective: from tp 4 on the ring sums each element in another order",
        edits=(
            _edit(
                "ranks/sides/tp/mirror.py",
                "        if self.mesh is None:\n            total = parts[0]\n",
                "        if True:  # planted\n            total = parts[0]\n",
            ),
        ),
        tests=(f"{_TWO_D}::test_a_correct_2d_row_passes_bitwise_at_world_size_4",),
    ),
    Plant(
        name="tp_rowwise_bias_added_whole",
        bug="the TP twin adds a row-split linear's whole bias to every partial product, not bias / tp",
        edits=(
            _edit(
                "ranks/sides/tp/mirror.py",
                "        return tuple(bias / parts for _ in range(parts))\n",
                "        return tuple(bias for _ in range(parts))  # planted\n",
            ),
        ),
        tests=(
            f"{_TWO_D}::test_a_correct_2d_row_passes_bitwise_at_world_size_4",
            "suites/parity/test_two_d_plan.py::test_the_twin_splits_a_row_split_linear_with_a_bias",
        ),
    ),
    Plant(
        name="tp_input_gradient_all_reduced",
        bug="the TP twin all-reduces the gradient of a block's gathered input where the candidate "
        "reduce-scatters it back to its sequence shards (another ring order from tp 4 on)",
        edits=(
            _edit(
                "ranks/sides/tp/mirror.py",
                "            module.forward = _replicated_input(module, parts, held, reducer, to)",
                "            module.forward = _replicated_input(module, parts, held, reducer, _replicate())  # planted",
            ),
        ),
        tests=(f"{_TWO_D}::test_a_correct_2d_row_passes_bitwise_at_world_size_4",),
    ),
)
"""The engine's plants, in the order ``make mutation`` runs them (after the scaler's)."""
