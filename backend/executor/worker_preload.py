"""Imported once by the `mp` executor's forkserver (mp_executor.prewarm): what every worker rank imports before it
can load a model, so that forked workers start with it in memory (~7 s of imports on a 2-core machine, torch and
diffusers' import of torch._dynamo the largest). Nothing here allocates on a device or reads a model file.

A failure to import any of it only costs that time back in the worker: the forkserver must never die of it.
"""

import importlib
import os

# First, before the imports below (seconds of them): end with the host (parent_death.py). The host names itself only
# when it started this server from a thread that lives as long as it does (its main thread).
_host = os.environ.pop("COMFYUI_H3_DIE_WITH_PID", None)
if _host:
    from .parent_death import die_with_parent

    die_with_parent(parent_pid=int(_host))

# The host put the package's folder on this process's PYTHONPATH only so this import could be found (the
# forkserver does not take the host's sys.path on Python < 3.13): take it out of the environment the workers and
# anything they start inherit (each worker gets the host's sys.path when it starts).
_added = os.environ.pop("COMFYUI_H3_PRELOAD_PATH", None)
if _added:
    _kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != _added]
    if _kept:
        os.environ["PYTHONPATH"] = os.pathsep.join(_kept)
    else:
        os.environ.pop("PYTHONPATH", None)

_MODULES = ["torch", "torch.distributed", "av", ".worker"]  # ".worker": relative to this package
try:
    from ..families import preload_modules

    _MODULES += preload_modules()  # each model family's own list (pipelines/<family>/preload.py)
except Exception:  # noqa: BLE001
    pass

loaded, failed = [], []
for _name in _MODULES:
    try:
        importlib.import_module(_name, __package__ if _name.startswith(".") else None)
        loaded.append(_name)
    except Exception as exc:  # noqa: BLE001 - a library version without one of these: the worker imports it itself
        failed.append(f"{_name}: {type(exc).__name__}: {exc}")
