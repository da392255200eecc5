"""Plants in what keeps a check's cost like training's (issue 40): a reference kept for nobody or
shared with nobody, a live step kept uncopied, a skip decision made on one rank's share alone, a
hand-reduced reference's parameters left as each rank built them, and ranks started without the
allocator settings that give freed memory back; rows that share a reference dealt to two lanes,
and an error in a lane's thread dropped; a step check that copies every gradient, looks for the
reference's overflow in shares that miss elements, trusts a dead mesh's cached facts, or
gathers a drifting row's gradients at every step; a staged check that measures the distance
between tensors of the same bits.

Why: each is a memory saving whose bug would not show as memory but as a wrong verdict, or as a
saving silently gone; the tests named kill each in seconds.
"""

from __future__ import annotations

from ci.mutation.edits import Edit, Plant

_REQUESTS = "suites/parity/test_requests.py"
_MEMORY = "suites/parity/test_check_memory.py"
_STEPCHECK = "suites/parity/test_stepcheck.py"
_ULP = "suites/parity/test_ulp.py"
_ALLOCATOR = "suites/harness/test_allocator.py"
_LANES = "suites/parity/test_lanes.py"
_REDUCE = "suites/parity/test_reduce_layout.py"


def _edit(file: str, old: str, new: str, package: str = "harness/parity") -> Edit:
    return Edit(file=file, old=old, new=new, package=package)


COST_PLANTS: tuple[Plant, ...] = (
    Plant(
        name="cost_reference_never_shared",
        bug="the runner says no later configuration reads a reference, so every candidate trains its "
        "reference again, the fp32 twins included",
        edits=(
            _edit(
                "ranks/requests.py",
                "        found.append(Request(config, config.reference_key() in later, twin_key(config) in later))\n",
                "        found.append(Request(config, False, False))  # planted\n",
            ),
        ),
        tests=(_REQUESTS,),
    ),
    Plant(
        name="cost_reference_kept_after_its_last_reader",
        bug="a kept reference stays on every rank after the last configuration that reads it ran",
        edits=(
            _edit(
                "ranks/entry.py",
                "        if reused is False:\n            kept.drop(key)\n",
                "        pass  # planted\n",
            ),
        ),
        tests=(_REQUESTS,),
    ),
    Plant(
        name="cost_live_step_kept_uncopied",
        bug="a step of a reference run in lockstep is kept as it is, its parameters and optimizer "
        "state the live tensors its run changes at every later step",
        edits=(
            _edit(
                "ranks/measure/stepcheck.py",
                "        if not self._drops or step.tensors is None:\n",
                "        if True:  # planted\n",
            ),
        ),
        tests=(f"{_MEMORY}::test_a_step_of_a_run_in_lockstep_is_copied_before_it_is_kept",),
    ),
    Plant(
        name="cost_skip_decided_on_rank_0s_share",
        bug="every rank compares the first share of each tensor, so a step that changed only the "
        "others is recorded as skipped",
        edits=(
            _edit(
                "ranks/train.py",
                "        return flat[self.rank * size : (self.rank + 1) * size]\n",
                "        return flat[0:size]  # planted\n",
            ),
        ),
        tests=(_MEMORY,),
    ),
    Plant(
        name="cost_skip_not_agreed",
        bug="each rank decides the skip from its own share alone",
        edits=(
            _edit(
                "ranks/train.py",
                "        if self.world > 1:\n            summed = torch.tensor(",
                "        if False:  # planted\n            summed = torch.tensor(",
            ),
        ),
        tests=(_MEMORY,),
    ),
    Plant(
        name="cost_ignored_parameters_not_broadcast",
        bug="the parameters a hand-reduced reference's DDP ignores keep each rank's own values",
        edits=(
            _edit(
                "ranks/sides/references.py",
                "    if dist.get_world_size() > 1:  # one broadcast of them all, as DDP's own is coalesced\n",
                "    if False:  # planted\n",
            ),
        ),
        tests=(_MEMORY,),
    ),
    Plant(
        name="cost_ranks_keep_freed_memory",
        bug="the ranks start without the allocator settings: freed tensors stay in the heap's holes",
        edits=(
            _edit(
                "allocator.py",
                'RANK_TUNABLES = {"glibc.malloc.mmap_threshold": "1048576", "glibc.malloc.hugetlb": "1"}',
                "RANK_TUNABLES: dict[str, str] = {}  # planted",
                package="harness/controller",
            ),
        ),
        tests=(_ALLOCATOR,),
    ),
    Plant(
        name="cost_ranks_import_the_engine_each",
        bug="the pool's preload never reaches the forkserver: every rank imports the engine itself",
        edits=(
            _edit(
                "reaper.py",
                "    PRELOAD.extend(module for module in modules if module not in PRELOAD)\n",
                "    pass  # planted\n",
                package="harness/controller",
            ),
        ),
        tests=(
            "suites/harness/test_pool.py::"
            "test_a_preloaded_module_is_imported_once_by_the_forkserver_not_by_each_rank",
        ),
    ),
    Plant(
        name="cost_fused_probe_imports_dynamo",
        bug="the controller's optimizer probe runs torch's add_param_group wrapper: dynamo imported before any row",
        edits=(
            _edit(
                "workload/registry.py",
                '    if inner is None or hasattr(inner, "__dynamo_disable"):\n',
                "    if True:  # planted\n",
            ),
        ),
        tests=(
            "suites/parity/test_cli.py::test_asking_whether_a_workloads_optimizer_is_fused_does_not_import_dynamo",
        ),
    ),
    Plant(
        name="cost_forkserver_started_after_the_imports",
        bug="the CLI never starts the ranks' forkserver early: it imports only once the first pool asks",
        edits=(
            _edit(
                "doors/early.py",
                "    if NO_RANKS & set(argv) or launched.launched():\n",
                "    if True:  # planted\n",
            ),
        ),
        tests=(
            "suites/parity/test_cli.py::"
            "test_the_cli_starts_the_ranks_forkserver_before_its_imports_only_where_ranks_start",
        ),
    ),
    Plant(
        name="cost_cli_waits_for_the_teardown",
        bug="the CLI exits through the interpreter's teardown, freeing every module's objects one by one",
        edits=(_edit("doors/cli.py", "    os._exit(code)\n", "    sys.exit(code)  # planted\n"),),
        tests=(
            "suites/parity/test_cli.py::"
            "test_the_cli_exits_after_its_exit_handlers_without_the_interpreters_teardown",
        ),
    ),
    Plant(
        name="cost_exit_drops_a_profile",
        bug="the CLI's quick exit skips a profiler's write: python -m cProfile gets no profile",
        edits=(
            _edit(
                "doors/cli.py",
                "    if sys.getprofile() is not None or sys.gettrace() is not None:\n",
                "    if False:  # planted\n",
            ),
        ),
        tests=(
            "suites/parity/test_cli.py::test_under_a_profiler_the_cli_exits_as_usual_so_the_profile_is_written",
        ),
    ),
    Plant(
        name="cost_heatmap_names_every_row",
        bug="the heatmap names all 213 rows of the default matrix: unreadable, and 2 s of drawing",
        edits=(_edit("report/plot.py", "    if len(rows) <= LABELLED_ALL:\n", "    if True:  # planted\n"),),
        tests=(
            "suites/parity/test_report.py::test_a_large_matrixs_heatmap_names_only_the_rows_it_shows_something_of",
        ),
    ),
    Plant(
        name="cost_lanes_split_a_shared_reference",
        bug="rows that share a reference are not one family: they may be dealt to two lanes and train it in each",
        edits=(
            _edit(
                "doors/lanes.py",
                '                parent[root(("row", config.id))] = root(("reference", shared))\n',
                "                pass  # planted\n",
            ),
        ),
        tests=(_LANES,),
    ),
    Plant(
        name="cost_last_deals_as_long_as_the_first",
        bug="every deal takes the full batch of rows: one lane runs a long last deal while the other is idle",
        edits=(
            _edit(
                "doors/lanes.py",
                "            if self.lanes > 1:  # a share of what is left per lane, at most ``rows``\n",
                "            if False:  # planted\n",
            ),
        ),
        tests=(f"{_LANES}::test_deals_shrink_as_the_rows_run_out",),
    ),
    Plant(
        name="cost_first_lane_takes_every_row",
        bug="the first lane to ask takes every row: the lanes are as good as one",
        edits=(
            _edit(
                "doors/runner.py",
                "        dealer = lanes.Dealer(group, batch_size, lanes=len(executors))\n",
                "        dealer = lanes.Dealer(group, batch_size, lanes=1)  # planted\n",
            ),
        ),
        tests=(f"{_LANES}::test_the_lanes_take_rows_as_they_are_free",),
    ),
    Plant(
        name="cost_lane_error_lost",
        bug="an error in a lane's thread is dropped: its rows have no verdict and the run says nothing",
        edits=(
            _edit(
                "doors/lanes.py",
                "            errors.append(error)\n            stop.set()\n",
                "            stop.set()  # planted\n",
            ),
        ),
        tests=(_LANES,),
    ),
    Plant(
        name="cost_controller_imports_the_ranks_loop",
        bug="the CLI reads the keep budget from the ranks' entry module: its process imports their loop",
        edits=(
            _edit(
                "__main__.py",
                "        requests.keep_budget()\n",
                "        from harness.parity.ranks import entry  # planted\n\n        entry.keep_budget()\n",
            ),
        ),
        tests=("suites/parity/test_cli.py::test_the_controller_starts_without_the_rank_side_libraries",),
    ),
    Plant(
        name="cost_ground_truth_before_the_rows",
        bug="the ground truth is measured before any row although a second group of ranks could run it",
        edits=(
            _edit("doors/ground_truths.py", "        if not parallel:\n", "        if True:  # planted\n"),
        ),
        tests=(f"{_LANES}::test_the_ground_truth_runs_on_the_second_group_while_the_first_runs_rows",),
    ),
    Plant(
        name="cost_one_call_skips_the_divide_before",
        bug="the one all-reduce of a shard group of 2 forgets the divide before the sum",
        edits=(
            _edit(
                "ranks/sides/two_ranks/order_free.py",
                "            flat.div_(pre)\n",
                "            pass  # planted\n",
            ),
        ),
        tests=(_REDUCE,),
    ),
    Plant(
        name="cost_one_call_never_taken",
        bug="the reference reduces a small model bucket by bucket at 2 ranks: a collective's latency each",
        edits=(
            _edit(
                "ranks/sides/two_ranks/order_free.py",
                "    return sum(g.numel() * g.element_size() for g in grads if g is not None) <= ONE_CALL_MB * 2**20\n",
                "    return False  # planted\n",
            ),
        ),
        tests=(_REDUCE,),
    ),
    Plant(
        name="cost_large_model_reduced_in_the_candidates_layout",
        bug="at 2 ranks a model too large for one call is reduced through the candidate's chunked layout",
        edits=(
            _edit(
                "ranks/sides/reduce_layout.py",
                "order_free.free(groups):  # 2 ranks: flat all-reduces\n",
                "order_free.free(groups) and order_free.one_call(grads):  # planted\n",
            ),
        ),
        tests=(_REDUCE,),
    ),
    Plant(
        name="cost_large_gradient_copied_into_a_buffer",
        bug="at 2 ranks a large gradient the caller gives up is copied into its bucket's buffer and out",
        edits=(
            _edit(
                "ranks/sides/two_ranks/order_free.py",
                "        and (consume or grad.dtype != reduce_dtype)\n",
                "        and False  # planted\n",
            ),
        ),
        tests=(f"{_REDUCE}::test_at_two_ranks_a_large_gradient_given_up_is_reduced_where_it_lies",),
    ),
    Plant(
        name="cost_in_place_reduction_skips_the_divide_before",
        bug="at 2 ranks a gradient reduced where it lies forgets the divide before the sum",
        edits=(
            _edit(
                "ranks/sides/two_ranks/order_free.py",
                "        if pre is not None and pre != 1:\n",
                "        if pre is not None and pre != 1 and not in_place:  # planted\n",
            ),
        ),
        tests=(f"{_REDUCE}::test_at_two_ranks_a_large_gradient_given_up_is_reduced_where_it_lies",),
    ),
    Plant(
        name="cost_kept_gradient_reduced_in_place",
        bug="at 2 ranks a gradient the caller keeps is overwritten by its reduction",
        edits=(
            _edit(
                "ranks/sides/two_ranks/order_free.py",
                "        and (consume or grad.dtype != reduce_dtype)\n",
                "        and True  # planted\n",
            ),
        ),
        tests=(f"{_REDUCE}::test_at_two_ranks_a_gradient_the_caller_keeps_is_not_reduced_in_place",),
    ),
    Plant(
        name="cost_check_copies_every_gradient",
        bug="the step check copies each rank's gradients every step to measure them",
        edits=(
            _edit(
                "ranks/measure/local.py",
                "        return found, held\n",
                "        return {n: p if p.values is None else dataclasses.replace(p, values=p.values.clone())"
                " for n, p in found.items()}, held  # planted\n",
            ),
        ),
        tests=(f"{_MEMORY}::test_gradients_are_measured_where_they_are_not_copied",),
    ),
    Plant(
        name="cost_overflow_share_drops_the_tail",
        bug="the reference's overflow is looked for in shares that leave the last elements to no rank",
        edits=(
            _edit(
                "ranks/measure/stepcheck.py",
                "        size = -(-flat.numel() // world)\n",
                "        size = flat.numel() // world  # planted\n",
            ),
        ),
        tests=(f"{_MEMORY}::test_the_ranks_shares_of_a_replicated_run_cover_each_element_once",),
    ),
    Plant(
        name="cost_overflow_checked_by_an_element_mask",
        bug="the reference's overflow is looked for by a mask of every element even when their sum is finite",
        edits=(
            _edit(
                "ranks/measure/stepcheck.py",
                "    if tensor.is_floating_point() and bool(tensor.sum().isfinite()):\n",
                "    if False:  # planted\n",
            ),
        ),
        tests=(f"{_STEPCHECK}::test_all_finite_writes_no_mask_of_every_element_when_their_sum_is_finite",),
    ),
    Plant(
        name="cost_overflow_trusts_a_sum_that_overflowed",
        bug="finite gradients whose sum overflows are taken for an overflow",
        edits=(
            _edit(
                "ranks/measure/stepcheck.py",
                "    return bool(tensor.isfinite().all())\n",
                "    return not tensor.is_floating_point()  # planted\n",
            ),
        ),
        tests=(f"{_STEPCHECK}::test_all_finite_says_what_the_element_mask_says",),
    ),
    Plant(
        name="cost_squares_in_a_second_copy",
        bug="the norm's parts are squared into a second float64 copy of the gradients",
        edits=(
            _edit(
                "ranks/measure/stepcheck.py",
                "    return float(tensor.double().square_().sum())\n",
                "    return float(tensor.double().pow(2).sum())  # planted\n",
            ),
        ),
        tests=(f"{_MEMORY}::test_the_norms_parts_are_summed_from_one_float64_copy_of_the_gradients",),
    ),
    Plant(
        name="cost_mesh_facts_of_a_dead_mesh",
        bug="a mesh's facts are cached by address alone: a new mesh where an old one lived gets the old's",
        edits=(
            _edit(
                "ranks/measure/local.py",
                "    if known is not None and known[0]() is mesh:\n",
                "    if known is not None:  # planted\n",
            ),
        ),
        tests=(f"{_MEMORY}::test_a_new_mesh_at_a_reused_address_is_asked_again",),
    ),
    Plant(
        name="cost_drifting_grads_gathered_each_step",
        bug="past the origin, every step whose gradients differ gathers them whole, failing or not",
        edits=(
            _edit(
                "ranks/measure/stepcheck.py",
                "        if wanted and (self.keep_all or not self._origin_found):  # they travel: gathered now\n",
                "        if wanted:  # planted\n",
            ),
        ),
        tests=(
            f"{_STEPCHECK}::test_differing_gradients_past_the_origin_are_gathered_only_where_they_travel",
        ),
    ),
    Plant(
        name="cost_pending_grads_not_copied",
        bug="the pieces kept for a step that may fail are the live gradients, changed by the optimizer step",
        edits=(
            _edit(
                "ranks/measure/stepcheck.py",
                '    if piece.values is None:\n        return piece\n    return dataclasses.replace(piece, values=piece.values.detach().to("cpu", copy=True))\n',
                "    return piece  # planted\n",
            ),
        ),
        tests=(
            f"{_STEPCHECK}::test_differing_gradients_past_the_origin_are_gathered_only_where_they_travel",
        ),
    ),
    Plant(
        name="cost_staged_measures_same_bits",
        bug="the staged check measures every element's ULP distance, tensors of the same bits included",
        edits=(
            _edit(
                "ranks/staged.py",
                "        if ulp.same_bits(a, b):  # the common case of an anchored step: nothing to measure\n",
                "        if False:  # planted\n",
            ),
        ),
        tests=(f"{_ULP}::test_the_staged_check_measures_no_distance_between_tensors_of_the_same_bits",),
    ),
    Plant(
        name="cost_same_bits_by_value",
        bug="same_bits compares values: two NaNs of one pattern differ, and the check measures them",
        edits=(
            _edit(
                "ranks/measure/ulp.py",
                "        return torch.equal(reference.detach().view(bits), candidate.detach().view(bits))\n",
                "        return torch.equal(reference, candidate)  # planted\n",
            ),
        ),
        tests=(f"{_ULP}::test_same_bits_holds_for_a_copy_nans_included",),
    ),
    Plant(
        name="cost_one_reduction_bound_drops_the_slack",
        bug="one reduction's shortcut bound leaves out the float64 sums' own rounding",
        edits=(
            _edit(
                "ranks/measure/bound.py",
                "        allowed = _one(mean, mean_abs, world, reduce_dtype, out) + 4 * 2.0**-53 * mean_abs\n",
                "        allowed = _one(mean, mean_abs, world, reduce_dtype, out)  # planted\n",
            ),
        ),
        tests=("suites/parity/test_reduction_bound.py",),
    ),
    Plant(
        name="cost_record_copies_gradients_it_divides",
        bug="a reference's record copies its whole gradients, then divides the copies: two passes",
        edits=(
            _edit(
                "ranks/sides/engines.py",
                "        held = gather.to_cpu if copy else gather.whole\n",
                "        held = gather.to_cpu  # planted\n",
            ),
        ),
        tests=(f"{_MEMORY}::test_a_whole_gradient_recorded_to_be_divided_is_not_copied_first",),
    ),
    Plant(
        name="cost_record_aliases_live_gradients",
        bug="a reference's record holds its live gradients where it keeps them as they are",
        edits=(
            _edit(
                "ranks/sides/engines.py",
                "        held = gather.to_cpu if copy else gather.whole\n",
                "        held = gather.whole  # planted\n",
            ),
        ),
        tests=(f"{_MEMORY}::test_a_whole_gradient_recorded_as_it_is_is_a_copy",),
    ),
)
