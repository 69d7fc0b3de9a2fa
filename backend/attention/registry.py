"""Attention backends by name: what an engine config names, the loader lists, and a model calls.

Contract of a backend's kernel: `fn(q, k, v, plan=None)` with q, k, v `[batch, seq, heads, head_dim]` (any strides
with a unit last stride) -> `[batch, seq, heads, head_dim]`, plain non-causal attention over the rows it is given
(H3 attends over one packed document with no mask). A backend that needs layout metadata (a sparse backend's tile
permutation) provides `make_plan(layout)`: the task calls it once per request and passes the plan to every block;
dense backends have no plan (None). A `gated` backend also takes `gate` [batch, seq, heads, head_dim] (learned gates
of a FastH3 student's coarse branch: vsa_kernel.py); the others refuse one. A new backend is one `register(...)`
call in its own module, listed in `_BUILTIN_MODULES` so it registers on first use.

An engine names its backend with an `AttentionSpec` (name + the backend's own frozen settings), the typed value that
travels from the loader or CLI to every rank; its text form ("vsa:topk=0.1,dense=10") is read by `AttentionSpec.parse`
alone, where a user types it.
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
    settings: type | None = None  # the backend's settings: a frozen dataclass, its defaults by `settings()`, text
    # by `settings.parse(text)` / `.spec()`; None: a backend without settings
    configure: Callable[[Any], "AttentionBackend"] | None = None  # settings -> the backend configured with them
    gated: bool = False  # fn takes (q, k, v, plan, gate): learned VSA gates (FastH3)
    check_device: Callable[[Any], None] | None = None  # torch.device -> None, or ValueError: the backend cannot run
    # there (called where a rank's runtime is made, before any weight loads)

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
_BUILTIN_MODULES = (".dispatch", ".vsa", ".sage")  # modules whose import registers the shipped backends


def register(backend: AttentionBackend) -> AttentionBackend:
    _BACKENDS[backend.name] = backend
    return backend


def _load_builtins() -> None:
    for module in _BUILTIN_MODULES:
        importlib.import_module(module, __package__)


@dataclass(frozen=True)
class AttentionSpec:
    """Which backend an engine attends with: a registered name and, for a backend with settings, its settings object
    (None: the backend's defaults; equal-to-default settings are stored as None so the two forms are one engine).
    Frozen and picklable: part of the engine config's identity."""
    name: str = "sdpa"
    settings: Any = None

    def __post_init__(self):
        if self.settings is not None and self.settings == type(self.settings)():
            object.__setattr__(self, "settings", None)

    def __str__(self) -> str:
        return self.name if self.settings is None else f"{self.name}:{self.settings.spec()}"

    @classmethod
    def parse(cls, text: str) -> "AttentionSpec":
        """A registered name, or "name:options" for a backend with settings (e.g. "vsa:topk=0.1,dense=10"): the one
        reader of the text form (CLI flags, configs written as text); one clear line on anything else."""
        base, sep, options = str(text).partition(":")
        backend = _registered(base, text)
        if not sep:
            return cls(base)
        if backend.settings is None:
            raise ValueError(f"Attention backend {base!r} takes no options, got {text!r}.")
        return cls(base, backend.settings.parse(options))


def _registered(name: str, asked: str) -> AttentionBackend:
    _load_builtins()
    try:
        return _BACKENDS[name]
    except KeyError:
        raise ValueError(f"Unknown attention backend {asked!r}; available: {', '.join(available())}") from None


def attention_spec(value: "AttentionSpec | str") -> AttentionSpec:
    """A spec as given, or one read from its text form."""
    return value if isinstance(value, AttentionSpec) else AttentionSpec.parse(value)


def get_backend(spec: "AttentionSpec | str") -> AttentionBackend:
    """The backend a spec names, configured with its settings (text is read by AttentionSpec.parse first)."""
    spec = attention_spec(spec)
    backend = _registered(spec.name, spec.name)
    if spec.settings is None:
        return backend
    if backend.settings is None or not isinstance(spec.settings, backend.settings):
        raise ValueError(f"Attention backend {spec.name!r} takes {getattr(backend.settings, '__name__', 'no')} "
                         f"settings, got {type(spec.settings).__name__}.")
    return backend.configure(spec.settings)


def _module_rank(backend: AttentionBackend) -> int:
    module = getattr(backend.fn, "__module__", "") or ""
    return next((i for i, m in enumerate(_BUILTIN_MODULES) if module.endswith(m)), len(_BUILTIN_MODULES))


def available() -> list[str]:
    """Registered names: the default ("sdpa") first, then by shipped module in _BUILTIN_MODULES' order and within
    one by registration, whatever imported them first. A newer backend comes in a later module, so it is appended to
    the loaders' lists and the choices saved workflows know keep their places."""
    _load_builtins()
    order = list(_BACKENDS)
    return sorted(order, key=lambda n: (n != "sdpa", _module_rank(_BACKENDS[n]), order.index(n)))


def dense_names() -> list[str]:
    """The backends that need no per-request plan (what a model without H3's packed layout, SeedVR2, can use)."""
    return [name for name in available() if _BACKENDS[name].make_plan is None]


def descriptions() -> dict[str, str]:
    _load_builtins()
    return {name: _BACKENDS[name].description for name in available()}
