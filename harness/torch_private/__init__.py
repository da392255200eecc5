"""Every private torch API the harness uses, in one place: one module a concern.

Why: the harness reads what torch's engines did (FSDP2's parameter groups, FSDP1's flat
parameters, a pipeline schedule's stages, dynamo's context of a compiled module) and, in a few
places, replaces a torch function for the length of one backward. None of that is public, so it
moves between torch versions: torch 2.11 has no ``collect_grad_tensors`` and one parameter group
per ``fully_shard`` state where 2.12 has a list. Kept here, a new torch breaks one module, each
function says which versions it was read from and branches where they differ, and
``suites/project/test_torch_private.py`` fails on a private torch name used anywhere else in
``harness/`` (``scaler/`` has its own ``scaler/_torch_private.py``: the library never imports the
harness).

The modules: :mod:`.fsdp2` (``fully_shard`` internals), :mod:`.fsdp1` (flat parameters and
handles), :mod:`.ddp`, :mod:`.tensors` (flattening and chunking helpers), :mod:`.dtensor`,
:mod:`.tensor_parallel`, :mod:`.pipelining`, :mod:`.checkpoint` (activation checkpointing's
wrapper and composable API), :mod:`.dynamo` (``torch.compile``'s state and inductor's cache),
:mod:`.dispatch` (dispatch modes and pytrees), :mod:`.c10d` (the default group's store and
timeout, torch's test skips), and :mod:`.patches` (the private functions replaced for one
backward, each checked against the installed torch).

This package imports no torch at its top level: the controller imports parts of the engine that
name it without ever running a rank.
"""

from __future__ import annotations

import re

SUPPORTED = ("2.11", "2.12", "2.13", "2.14")
"""The torch releases every module here was read from (``major.minor``), oldest first: the range
``pyproject.toml`` declares and ``make compat`` runs."""


class UnsupportedTorch(RuntimeError):
    """A feature the installed torch cannot run, raised where an adapter has no branch for it.

    A parity row that meets it is refused with this message (a skip naming the version and what
    needs a newer one), never an ERROR with an ``ImportError`` deep in a rank's traceback."""

    def __init__(self, feature: str, *, needs: str, installed: str | None = None) -> None:
        self.feature = feature
        self.needs = needs
        self.installed = installed if installed is not None else torch_version()
        super().__init__(f"torch {self.installed} cannot run {feature}: it needs torch {needs} or newer")


def torch_version() -> str:
    """The installed torch's version, without its local build tag (``2.11.0``, not ``2.11.0+cu130``)."""
    import torch

    return torch.__version__.split("+", 1)[0]


def release(version: str | None = None) -> tuple[int, int]:
    """``(major, minor)`` of ``version`` (the installed torch's by default): ``2.14.1`` -> ``(2, 14)``."""
    match = re.match(r"(\d+)\.(\d+)", version if version is not None else torch_version())
    if match is None:
        raise ValueError(f"not a torch version: {version!r}")
    return int(match.group(1)), int(match.group(2))


def at_least(major: int, minor: int) -> bool:
    """Whether the installed torch is ``major.minor`` or newer."""
    return release() >= (major, minor)
