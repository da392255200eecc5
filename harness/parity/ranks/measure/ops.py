"""One level below the first diverging module: the ATen ops its forward ran (rank side).

Why a second re-run: which module to look inside is known only once the first pass (module
outputs, ``localize.Probe``) has been compared, and recording every op of every module on the
first pass would cost far more than replaying the few steps again. So each rank compares its own
module outputs (``first_forward_divergence``), the ranks agree whether any of them found one, and
if so both sides are re-run once more with an :class:`OpProbe` on that module: a
``TorchDispatchMode`` entered when the module's forward starts (after the wrappers' pre-forward
hooks: FSDP's all-gather is not the module's) and left when it returns (before any forward hook:
what a hook does to the output is not the module's own op). Each op's floating-point outputs are
kept as CPU copies, with the op's name (``aten.addmm.default``); ``pinpoint.locate_op`` aligns the
two sequences on the controller.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from harness.parity.plan.profiles import ToleranceProfile
from harness.parity.ranks.measure.distance import tensor_diff
from harness.parity.ranks.sides import engines
from harness.parity.ranks.sides.full.gather import module_names
from harness.torch_private.dispatch import TorchDispatchMode, tree_leaves


def split_key(key: str) -> tuple[str, int]:
    """``"blocks.1#2[0]"`` -> ``("blocks.1", 2)``: the module's name and which call."""
    name = key.split("[", 1)[0]
    name, _, call = name.partition("#")
    return name, int(call) if call else 0


def first_forward_divergence(
    reference: list[tuple[str, torch.Tensor]],
    candidate: list[tuple[str, torch.Tensor]],
    profile: ToleranceProfile,
) -> str | None:
    """The key of this rank's first module output (in the reference's order) beyond ``profile``."""
    got = dict(candidate)
    for key, want in reference:
        other = got.get(key)
        if other is None or other.shape != want.shape:
            return key
        if tensor_diff(want, other, profile, step=0, kind="forward", name=key).mismatched:
            return key
    return None


class _Recorder(TorchDispatchMode):
    """Every op's floating-point outputs, in dispatch order."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, torch.Tensor]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            # plain tensors only: a subclass (a DTensor) would need a collective to be read
            if type(tensor) in (torch.Tensor, torch.nn.Parameter) and tensor.is_floating_point():
                self.ops.append((str(func), tensor.detach().to("cpu", copy=True)))
        return out


class OpProbe:
    """Records the ops of one call of one module, at one step."""

    def __init__(self, step: int, key: str) -> None:
        self.step = step
        self.module, self.call = split_key(key)
        self.ops: list[tuple[str, torch.Tensor]] = []
        self._calls = 0
        self._active: _Recorder | None = None

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if self._calls == self.call:
            self._active = _Recorder()
            self._active.__enter__()
        self._calls += 1

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._leave()

    def _leave(self) -> None:
        if self._active is not None:
            recorder, self._active = self._active, None
            recorder.__exit__(None, None, None)
            self.ops = recorder.ops

    @contextlib.contextmanager
    def observe(self, engine: engines.Engine, step: int) -> Iterator[None]:
        if step != self.step:
            yield
            return
        module = dict(module_names(engine.trained_module()))[self.module]
        handles = [
            module.register_forward_pre_hook(self._pre),
            module.register_forward_hook(self._post, prepend=True),
        ]
        try:
            yield
        finally:
            self._leave()
            for handle in handles:
                handle.remove()
