"""Plants in a resume row's rank side and its causes (``harness/parity/ranks/resume*.py``,
``judge/causes/resume.py``): a checkpoint that loses one piece of state, or a report that stops
naming it.

Why: each is a resume bug users report (the issue's list), planted into *our* checkpoint code; a
resume row that still passed with it would be a verdict that lies. The tests that kill each are
the resume rows of ``suites/parity/test_resume.py`` (bitwise against the run straight through)
and the named causes of ``suites/parity/test_resume_causes.py``; a lost param group (the fresh
optimizer's hyperparameters, which no row moves but the scheduled one's learning rate) by each
method's save-and-load round trip, ``suites/parity/test_resume_store.py``.
"""

from __future__ import annotations

from ci.mutation.edits import Edit, Plant

_PARITY = "harness/parity"
_ROWS = "suites/parity/test_resume.py"
_JUDGE = "suites/parity/test_resume_judge.py"
_CAUSES = "suites/parity/test_resume_causes.py"
_RESHARD = "suites/parity/test_reshard.py"
_STORE = "suites/parity/test_resume_store.py"
_GROUPS = '            mine.update({k: v for k, v in theirs.items() if k not in ("params", "param_names")})\n'


def _edit(file: str, old: str, new: str) -> Edit:
    return Edit(file=file, old=old, new=new, package=_PARITY)


RESUME_PLANTS: tuple[Plant, ...] = (
    Plant(
        name="resume_optimizer_not_restored",
        bug="the DCP load restores the model and the scaler but not the optimizer (moments back at zero)",
        edits=(
            _edit(
                "ranks/restart/resume_store.py",
                '        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])\n',
                '        set_model_state_dict(model, state["model"])  # planted\n',
            ),
        ),
        tests=(_ROWS,),
    ),
    Plant(
        name="resume_step_counter_reset",
        bug="the name-keyed load hands the optimizer its moments but resets every step count",
        edits=(
            _edit(
                "ranks/restart/resume_store.py",
                "key: self._like(value, param) for key, value in sharded.local_optimizer.state[local].items()\n",
                'key: torch.zeros_like(value) if key == "step" else self._like(value, param)  # planted\n'
                "                for key, value in sharded.local_optimizer.state[local].items()\n",
            ),
        ),
        tests=(_ROWS,),
    ),
    Plant(
        name="resume_scaler_not_restored",
        bug="the DCP load never loads the scaler's state: the scale is back at its initial value",
        edits=(
            _edit(
                "ranks/restart/resume_store.py",
                'optim_state_dict=state["optim"])\n        scaler.load_state_dict(state["scaler"])\n',
                'optim_state_dict=state["optim"])  # planted: the scaler is not loaded\n',
            ),
        ),
        tests=(_ROWS,),
    ),
    Plant(
        name="resume_rng_not_restored",
        bug="the loop's saved RNG state is not restored: dropout after resuming draws other masks",
        edits=(
            _edit(
                "ranks/restart/resume.py",
                "            carried.state = rng\n",
                "            pass  # planted\n",
            ),
        ),
        tests=(_ROWS,),
    ),
    Plant(
        name="resume_weights_late",
        bug="the load runs after the first resumed step: that step trains the fresh model's weights",
        edits=(
            _edit(
                "ranks/restart/resume.py",
                "        self._load(base, folder, store, engine, optimizers[0], scaler, step)\n",
                "        self.pending.insert(0, functools.partial(self._load, base, folder, store, engine, "
                "optimizers[0], scaler, step))  # planted\n",
            ),
        ),
        tests=(_ROWS,),
    ),
    Plant(
        name="resume_scheduler_not_restored",
        bug="the LR schedulers' saved states are not restored: they start again from their first epoch",
        edits=(
            _edit(
                "ranks/restart/resume.py",
                "            scheduler.load_state_dict(saved)\n",
                "            pass  # planted\n",
            ),
        ),
        tests=(_ROWS,),
    ),
    Plant(
        name="resume_weights_not_restored",
        bug="the name-keyed load restores the optimizer and the scaler but never the model's weights",
        edits=(
            _edit(
                "ranks/restart/resume_store.py",
                '        set_model_state_dict(model, state["model"])\n',
                "        pass  # planted\n",
            ),
        ),
        tests=(_ROWS,),
    ),
    Plant(
        name="resume_param_groups_not_restored",
        bug="the name-keyed load restores the optimizer's state but not its param groups: the fresh "
        "optimizer's learning rate, betas and weight decay train on",
        edits=(
            _edit(
                "ranks/restart/resume_store.py",
                "        for mine, theirs in zip(optimizer.param_groups, sharded.param_groups, strict=True):\n"
                + _GROUPS,
                "        pass  # planted: the param groups are not restored\n",
            ),
        ),
        tests=(_STORE,),
    ),
    Plant(
        name="resume_param_groups_not_saved",
        bug="the name-keyed save writes the optimizer's state but the wrapper's own param groups (the "
        "defaults), not the trained optimizer's",
        edits=(
            _edit(
                "ranks/restart/resume_store.py",
                "        for mine, theirs in zip(sharded.param_groups, optimizer.param_groups, strict=True):\n"
                + _GROUPS,
                "        pass  # planted: the param groups are not saved\n",
            ),
        ),
        tests=(_STORE,),
    ),
    Plant(
        name="resume_hyperparameters_not_restored",
        bug="the DCP load restores each param group's learning rate but leaves its other hyperparameters "
        "(betas, eps, weight decay) at the fresh optimizer's",
        edits=(
            _edit(
                "ranks/restart/resume_store.py",
                "        dcp.load(state, checkpoint_id=folder, planner=CurrentFormatLoadPlanner())\n        set_state_dict(",
                '        fresh = [dict(group) for group in optim_state["param_groups"]]  # planted\n'
                "        dcp.load(state, checkpoint_id=folder, planner=CurrentFormatLoadPlanner())\n"
                '        for group, own in zip(state["optim"]["param_groups"], fresh, strict=True):\n'
                '            group.update({k: v for k, v in own.items() if k not in ("lr", "params")})\n'
                "        set_state_dict(",
            ),
        ),
        tests=(_STORE,),
    ),
    Plant(
        name="resume_shard_misplaced",
        bug="a load into another layout that put the saved values in other rows is reported as weights never loaded",
        edits=(
            _edit(
                "ranks/restart/resume_state.py",
                "        same_values = mine is not None and torch.equal(",
                "        same_values = False and torch.equal(  # planted",
            ),
        ),
        tests=(_CAUSES,),
    ),
    Plant(
        name="resume_causes_never_named",
        bug="the report's catalogue leaves out the resume causes: a failing resume row says nothing of what it lost",
        edits=(
            _edit(
                "judge/causes/__init__.py",
                "    *(known.name for known in resume.CAUSES),  # a resume row's headline first\n",
                "    # planted: the resume causes left out\n",
            ),
        ),
        tests=(_JUDGE,),
    ),
    Plant(
        name="resume_audit_not_recorded",
        bug="the resumed step's audits never reach the record: the causes have nothing to read",
        edits=(
            _edit(
                "ranks/restart/resume.py",
                "            return dataclasses.replace(found, resume=self._audit)\n",
                "            return found  # planted\n",
            ),
        ),
        tests=(_ROWS,),
    ),
    Plant(
        name="resume_reshard_shard_misplaced_unnamed",
        bug="a load at another world size that put the saved values in another rank's place is "
        "reported as weights never loaded",
        edits=(
            _edit(
                "ranks/restart/reshard.py",
                "        return saved.numel() > 1 and torch.equal(",
                "        return False and torch.equal(  # planted\n            ",
            ),
        ),
        tests=(_RESHARD,),
    ),
    Plant(
        name="resume_reshard_reference_optimizer_fresh",
        bug="the reference that changes world size takes over its weights and scaler but not its "
        "optimizer: a correct resharded row fails against a reference whose moments restarted",
        edits=(
            _edit(
                "ranks/restart/reshard.py",
                '    optimizer.load_state_dict(whole["optimizer"])\n',
                "    pass  # planted\n",
            ),
        ),
        tests=(_RESHARD,),
    ),
)
