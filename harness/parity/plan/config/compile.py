"""``torch.compile`` of the model, on both sides of a configuration: per block or whole, with
inductor or ``aot_eager``.

Why a part: compiling may legitimately change the numbers (inductor's generated kernels fuse and
round differently from eager ops), so the reference keeps it: the candidate's unsharded twin is
compiled the same way, the same modules with the same options (docs/architecture.md, section 4.2:
what the reference keeps and drops). Then a compiled row stays bitwise where its
eager row is, and a difference is sharding's. The part owns which modules are compiled, by which
backend, its words in the id and its share of the reference key (an eager reference and a compiled
one are different runs).
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from harness.parity.plan.config.axes import COMPILE_BACKENDS, COMPILE_MODES, COMPILE_TWINS, choice

if TYPE_CHECKING:
    from harness.parity.plan.config import ParityConfig

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
"""inductor's cache folder (its FX graph and AOT autograd caches live below it)."""


def cache_folder() -> str:
    """Where compiled rows keep inductor's caches (FX graphs, AOT autograd): ``$TORCHINDUCTOR_CACHE_DIR``
    when set, else inductor's own default, one folder per user in the temporary folder
    (``torchinductor_<user>``). Why that one: every rank of a row, both sides and every later run on
    the machine see it, so a graph compiled once is a cache hit for all of them (a 3-block MLP costs
    about 35 s of inductor on two cores uncached). Under torchrun across machines, set
    ``TORCHINDUCTOR_CACHE_DIR`` to a folder every node sees. (torch is imported here, lazily: the
    controller asks only when a row compiled.)"""
    if os.environ.get(CACHE_ENV):
        return os.path.abspath(os.environ[CACHE_ENV])
    from harness.torch_private import dynamo

    return os.path.abspath(dynamo.inductor_cache_dir())


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Compile:
    """``Compile()`` compiles nothing (both sides run eager)."""

    mode: str | None = None
    """``block``: every innermost FSDP unit (a unit holding no other unit: the blocks the matrix
    wraps) compiled with ``module.compile()``; ``whole``: the model compiled as one module; ``None``:
    eager (``axes.COMPILE_MODES``). ``compile_block``/``compile_whole`` in the id."""
    backend: str = "inductor"
    """The ``torch.compile`` backend: ``inductor`` (generated kernels, its own rounding) or
    ``aot_eager`` (the graph traced and run by eager kernels: the same rounding as eager, and fast to
    compile); named in the id when it is not ``inductor``."""
    twin: str = "compiled"
    """The reference: ``compiled`` as its candidate (the twin: what may change the numbers is kept),
    or ``eager`` (``eager_twin`` in the id): the candidate's difference is then compile's own plus
    sharding's, which a known cause (``compile_changes_numerics``) tells apart."""

    def __post_init__(self) -> None:
        choice("compile", self.mode, COMPILE_MODES)
        choice("compile_backend", self.backend, COMPILE_BACKENDS)
        choice("compile_twin", self.twin, COMPILE_TWINS)
        if self.mode is None and self.twin != "compiled":
            raise ValueError(f"compile_twin={self.twin!r} needs a compile mode (compile='block' or 'whole')")
        if self.mode is None and self.backend != "inductor":
            raise ValueError(
                f"compile_backend={self.backend!r} needs a compile mode (compile='block' or 'whole')"
            )

    def check(self, config: ParityConfig) -> None:
        """Refuse what the reference does not mirror when compiled (the part's own rules)."""
        if (self.mode == "function") != (config.engine == "user" and self.mode is not None):
            raise ValueError(
                "compile='function' is a user's parallelize function compiling itself (engine='user', "
                "compile_twin='eager' to see compile's own difference); the built-in engines take "
                "compile='block' or 'whole'"
            )
        if self.mode == "function" and self.twin != "eager":
            raise ValueError(
                "compile='function' with its twin compiled is the function's plain row: leave compile None"
            )
        if self.mode is None or self.mode == "function":
            return
        if config.reference != "ddp":
            raise ValueError("compile checks a candidate against its DDP twin (reference='ddp')")
        if config.mesh.tp is not None:
            raise ValueError("compile is not mirrored under tensor parallelism (the twin's split matmuls)")
        if config.loop.checkpoint is not None:
            raise ValueError("compile with activation checkpointing is not mirrored yet (checkpoint=None)")
        if config.resume.at is not None:
            raise ValueError("compile on a resume row is not mirrored yet (resume_at=None)")

    @property
    def compiled(self) -> bool:
        return self.mode is not None

    def id_parts(self) -> list[str]:
        """``compile_block``, ``compile_whole``, then ``aot_eager`` when that is the backend, and
        ``eager_twin`` when the reference is not compiled."""
        if self.mode is None:
            return []
        if self.mode == "function":
            return ["eager_twin"]
        backend = [self.backend] if self.backend != "inductor" else []
        return [f"compile_{self.mode}", *backend, *(["eager_twin"] if self.twin == "eager" else [])]

    def reference_key(self) -> tuple[object, ...]:
        """The reference is compiled as its candidate is (an eager twin is the eager rows' reference;
        a user's function's eager twin is its own: that function's other rows' twin compiles)."""
        if self.mode == "function":
            return ("function", "eager")
        if self.mode is None or self.twin == "eager":
            return (None, None)
        return (self.mode, self.backend)
