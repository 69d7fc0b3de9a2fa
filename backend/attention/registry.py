"""Attention backends by name: what an engine config names, the loader lists, and a model calls.

Contract of a backend's kernel: `fn(q, k, v, plan=None)` with q, k, v `[batch, seq, heads, head_dim]` (any strides
with a unit last stride) -> `[batch, seq, heads, head_dim]`, plain non-causal attention over the rows it is given
(H3 attends over one packed document with no mask). A backend that needs layout metadata (a sparse backend's tile
permutation) provides `make_plan(layout)`: the task calls it once per request and passes the plan to every block;
dense backends have no plan (None). A `gated` backend also takes `gate` [batch, seq, heads, head_dim] (learned gates
of a FastH3 student's coarse branch: vsa_kernel.py); the others refuse one. A new backend is one `register(...)`
call in its own module, listed in `_BUILTIN_MODULES` so it registers on first use.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

AttentionFn = Callable[..., Any]


@dataclass(frozen=True)
class AttentionBackend:
    name: str
    fn: AttentionFn  # (q, k, v, plan=None) -> out
    description: str
    make_plan: Callable[[Any], Any] | None = None  # per-request layout -> plan; None: the backend needs none
    configure: Callable[[str], "AttentionBackend"] | None = None  # "name:options" -> a configured backend (vsa)
    gated: bool = False  # fn takes (q, k, v, plan, gate): learned VSA gates (FastH3)

    def __call__(self, q, k, v, plan=None, gate=None):
        if gate is None:
            return self.fn(q, k, v, plan)
        if not self.gated:
            raise ValueError(f"The attention backend {self.name!r} cannot apply learned VSA gates (a FastH3 student "
                             "with gates): choose attention vsa.")
        return self.fn(q, k, v, plan, gate)

    def plan_for(self, layout) -> Any:
        return None if self.make_plan is None else self.make_plan(layout)


_BACKENDS: dict[str, AttentionBackend] = {}
_BUILTIN_MODULES = (".dispatch", ".vsa")  # modules whose import registers the shipped backends


def register(backend: AttentionBackend) -> AttentionBackend:
    _BACKENDS[backend.name] = backend
    return backend


def _load_builtins() -> None:
    for module in _BUILTIN_MODULES:
        importlib.import_module(module, __package__)


def get_backend(name: str) -> AttentionBackend:
    """A registered name, or "name:options" for a backend that takes options (e.g. "vsa:topk=0.1,dense=10")."""
    _load_builtins()
    base, sep, options = name.partition(":")
    try:
        backend = _BACKENDS[base]
    except KeyError:
        raise ValueError(f"Unknown attention backend {name!r}; available: {', '.join(available())}") from None
    if not sep:
        return backend
    if backend.configure is None:
        raise ValueError(f"Attention backend {base!r} takes no options, got {name!r}.")
    return backend.configure(options)


def available() -> list[str]:
    """Registered names, the default ("sdpa") first."""
    _load_builtins()
    return sorted(_BACKENDS, key=lambda n: (n != "sdpa", n))


def dense_names() -> list[str]:
    """The backends that need no per-request plan (what a model without H3's packed layout, SeedVR2, can use)."""
    return [name for name in available() if _BACKENDS[name].make_plan is None]


def descriptions() -> dict[str, str]:
    _load_builtins()
    return {name: _BACKENDS[name].description for name in available()}
