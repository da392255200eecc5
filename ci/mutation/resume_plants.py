"""Plants in a resume row's rank side and its causes (``harness/parity/ranks/resume*.py``,
``judge/causes/resume.py``): a checkpoint that loses one piece of state, or a report that stops
naming it.

Why: each is a resume bug users report (the issue's list), planted into *our* checkpoint code; a
resume row that still passed with it would be a verdict that lies. The tests that kill each are
the resume rows of ``suites/parity/test_resume.py`` (bitwise against the run straight through)
and the named causes of ``suites/parity/test_resume_causes.py``.
"""

from __future__ import annotations

from ci.mutation.edits import Edit, Plant

_PARITY = "harness/parity"
_ROWS = "suites/parity/test_resume.py"
_JUDGE = "suites/parity/test_resume_judge.py"
_CAUSES = "suites/parity/test_resume_causes.py"
_RESHARD = "suites/parity/test_reshard.py"


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
                '            found["resume"] = self._audit\n',
                "            pass  # planted\n",
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
