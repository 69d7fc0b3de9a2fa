"""Model families by name: what the engine, executor and worker know of a model, and all they know.

A family is an object (usually a module-level instance) with:
- `name`, and `preload`: modules worth importing once in the workers' forkserver (worker_preload.py);
- `check(config)`: refuse a config before any weight moves (e.g. H3's "degree divides the heads");
- `memory_bytes(config)`: what one engine of it holds per rank (the engine registry's eviction budget);
- `build(runtime, options) -> pipeline`, whose `run(request, on_step, should_stop)` the worker calls;
- optionally `live_options`: names of option fields a loaded engine takes without starting again (H3's LoRAs). A
  config differing from a resident engine's only there reuses that engine (EngineConfig.identity); every job carries
  their values and the worker hands them to `pipeline.set_live_options(values)` before running it, which switches
  in place or raises errors.ReloadNeeded (the engine then starts again with them).
Its options are a frozen dataclass inside the engine config (part of the config's identity). Adding a family is one
package under pipelines/ plus one line below; tests register theirs with `register()` or name it by reference
("module:attribute", importable in the workers). Nothing here imports a family until it is asked for.
"""

from __future__ import annotations

import importlib
import importlib.util

_PKG = __package__  # comfyui_h3.backend

# name -> "module:attribute" (module relative to this package when it starts with ".")
_FAMILIES: dict[str, str] = {
    "h3": ".pipelines.h3.family:FAMILY",
    "seedvr2": ".pipelines.seedvr2.family:FAMILY",
}
_LOADED: dict[str, object] = {}


def register(name: str, reference: str) -> None:
    """Make `name` resolve to the family at `reference` ("module:attribute"). A test family registered here is known
    to this process only; give workers the reference itself as the config's family (they import it)."""
    _FAMILIES[name] = reference
    _LOADED.pop(name, None)


def names() -> list[str]:
    return sorted(_FAMILIES)


def get(name: str):
    """The family called `name`, or the one at reference `name` ("module:attribute")."""
    family = _LOADED.get(name)
    if family is not None:
        return family
    reference = _FAMILIES.get(name, name)
    if ":" not in reference:
        raise ValueError(f"Unknown model family {name!r}; known: {', '.join(names())}.")
    module_name, attribute = reference.split(":", 1)
    module = importlib.import_module(module_name, _PKG if module_name.startswith(".") else None)
    family = getattr(module, attribute)
    _LOADED[name] = family
    return family


def preload_modules() -> list[str]:
    """For each registered family, the `preload` module beside its family module (absolute names; a family package
    without one is skipped by the importer): the forkserver imports them without importing the families."""
    modules = []
    for reference in _FAMILIES.values():
        module_name = reference.split(":", 1)[0]
        absolute = importlib.util.resolve_name(module_name, _PKG) if module_name.startswith(".") else module_name
        modules.append(absolute.rsplit(".", 1)[0] + ".preload")
    return modules
