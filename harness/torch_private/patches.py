"""The private torch functions the harness replaces for the length of one backward, declared with
the torch versions they were read from and checked against the installed torch.

Why a patch at all (``harness/parity/ranks/sides/capture.py`` says it in full): torch offers no
hook that sees a sharded engine's gradients before it reduces them without taking over the
reduction. A site names the function, the leading parameters the recording takes, the caller that
looks the function up by its module-level name at call time (what makes the replacement reach
FSDP), and the private attributes the recording reads with the function that sets them.
:func:`torch_differs` checks every one against the installed torch: a torch that renamed one,
changed its parameters or stopped calling it by name would otherwise capture nothing, silently.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from harness.torch_private import SUPPORTED


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PatchSite:
    """One private torch function replaced for the length of one backward (module docstring)."""

    module: str
    name: str
    parameters: tuple[str, ...]
    """Its leading parameters, which the recording takes by position."""
    called_from: str
    """The function of ``module`` (``Class.method`` or a function) that calls it by its module-level
    name when FSDP reduces: replacing the module's attribute reaches FSDP only so."""
    reads: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    """The private attributes the recording reads: ``(module, function that sets them, names)``."""
    read_in: tuple[str, ...] = SUPPORTED
    """The torch releases whose sources showed the site as declared."""


def _attribute(module: str, dotted: str) -> Any:
    found: Any = importlib.import_module(module)
    for part in dotted.split("."):
        found = getattr(found, part)
    return found


def _names_used(function: Any) -> set[str]:
    """The global and attribute names ``function``'s own code uses (decorators unwrapped)."""
    return set(inspect.unwrap(function).__code__.co_names)


def torch_differs(sites: Iterable[PatchSite]) -> list[str]:
    """What of ``sites`` the installed torch no longer has as the torch releases they were read
    from had it, one line each (empty: every patch still reaches FSDP and reads what it read)."""
    import torch

    found: list[str] = []
    for site in sites:
        read = ", ".join(site.read_in)
        where = f"{site.module}.{site.name} (read in torch {read}, installed {torch.__version__})"
        try:
            function = _attribute(site.module, site.name)
            caller = _attribute(site.module, site.called_from)
        except (ImportError, AttributeError) as error:
            found.append(f"{where}: {error}")
            continue
        parameters = tuple(inspect.signature(function).parameters)[: len(site.parameters)]
        if parameters != site.parameters:
            found.append(f"{where}: its parameters begin {parameters}, the recording takes {site.parameters}")
        if site.name not in _names_used(caller):
            found.append(
                f"{where}: {site.called_from} no longer calls it by name; the patch would not be reached"
            )
        for module, setter, names in site.reads:
            try:
                missing = sorted(set(names) - _names_used(_attribute(module, setter)))
            except (ImportError, AttributeError) as error:
                found.append(f"{where}: {error}")
                continue
            if missing:
                found.append(
                    f"{where}: {module}.{setter} no longer sets {missing}, which the recording reads"
                )
    return found


@contextlib.contextmanager
def patched(site: PatchSite, replacement: Callable[[Any], Any]) -> Iterator[None]:
    """``site``'s function replaced by ``replacement(original)`` inside the block, put back after:
    the one place the harness writes to torch."""
    module = importlib.import_module(site.module)
    original = getattr(module, site.name)
    setattr(module, site.name, replacement(original))
    try:
        yield
    finally:
        setattr(module, site.name, original)
