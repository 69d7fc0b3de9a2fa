"""Freeing ComfyUI's device memory before our workers load, and the "free memory" / "Unload Models" hook."""

from __future__ import annotations

import functools
import logging
import threading
from typing import Callable

from ._comfy import _comfy
from .queue_flags import install_flag_redelivery

log = logging.getLogger("comfyui_h3")

__all__ = ["free_comfy_device_memory", "register_free_memory_hook", "ensure_free_memory_hook"]


def _torch_device(device):
    import torch  # only reached when ComfyUI (and so torch) is loaded

    if isinstance(device, torch.device):
        return device
    if isinstance(device, int):
        return torch.device("cuda", device)
    return torch.device(str(device))


def free_comfy_device_memory(device) -> bool:
    """Ask ComfyUI to move its own models off ``device`` and return cached blocks, before our workers load there.

    ``device`` is a torch.device, a string such as ``"cuda:1"`` or a CUDA index. Uses
    ``comfy.model_management.free_memory(1e30, device)`` (what ``unload_all_models`` does, but for the given device and
    without firing our own free-memory callbacks) and then ``soft_empty_cache()``. Returns True when ComfyUI was asked,
    False headless, for a CPU device, or when ComfyUI lacks the functions.
    """
    mm = _comfy("comfy.model_management")
    if mm is None:
        return False
    try:
        dev = _torch_device(device)
    except Exception as exc:
        raise ValueError(f"free_comfy_device_memory: not a device: {device!r}") from exc
    if dev.type == "cpu":
        return False
    asked = False
    free_memory = getattr(mm, "free_memory", None)
    if free_memory is not None:
        free_memory(1e30, dev)
        asked = True
    else:  # no per-device call: unload everything, through the function below our wrapper (no callbacks fired)
        original = _unwrap_ours(getattr(mm, "unload_all_models", None))
        if original is not None:
            original()
            asked = True
    empty = getattr(mm, "soft_empty_cache", None)
    if empty is not None:
        empty()
        asked = True
    return asked


# ----------------------------------------------------------------------------------------------------------------------
# "Free memory" hook
#
# ComfyUI v0.8.0: POST /free {"unload_models": true} (and the frontend's Unload Models button; {"free_memory": true}
# implies it) only sets a flag on the prompt queue. main.py's prompt_worker thread reads the flags after the current
# prompt finishes and calls `comfy.model_management.unload_all_models()` (looked up on the module at call time). So we
# replace that module attribute with a wrapper that calls the original and then our callbacks. Why this and not an
# aiohttp middleware on /free: the middleware would run on the event loop while a prompt may still be executing on our
# engine; the wrapper runs on the prompt worker thread, between prompts, so shutting the engine down cannot race a job.
# It also fires for any other caller of unload_all_models (other packs, future core code).
#
# Robustness: the wrapper is marked, and the callback registry lives on the model_management module itself, so two
# copies of this module (the pack loaded by path by ComfyUI and as `comfyui_h3`) or a reload never wrap twice; a
# wrapper that another pack put around ours (functools.wraps) is seen through `__wrapped__`; a thread-local guard runs
# the callbacks once per outermost call even if some code wrapped us without `__wrapped__`. Callback errors are logged,
# never raised: an exception there would kill ComfyUI's prompt worker thread. `ensure_free_memory_hook()` re-installs
# the wrapper if something restored the original (core's hook_breaker restores only `cast_to` in v0.8.0). The queue's
# set_flag is wrapped too, so that a /free arriving while the prompt worker is between loops is not slept through.

_HOOK_MARK = "_comfyui_h3_free_memory_hook"
_STATE_ATTR = "_comfyui_h3_free_memory_state"
# Callbacks registered while no ComfyUI is loaded; moved onto ComfyUI's state when the wrapper is installed.
_headless_hook_state = {"callbacks": [], "lock": threading.RLock(), "original": None, "local": threading.local()}


def _hook_state(mm) -> dict:
    state = getattr(mm, _STATE_ATTR, None)
    if state is None:
        state = {"callbacks": [], "lock": threading.RLock(), "original": None, "local": threading.local()}
        setattr(mm, _STATE_ATTR, state)
    return state


def _is_ours(fn) -> bool:
    seen = 0
    while fn is not None and seen < 32:
        if getattr(fn, _HOOK_MARK, False):
            return True
        fn = getattr(fn, "__wrapped__", None)
        seen += 1
    return False


def _unwrap_ours(fn):
    """The function below our wrapper (ComfyUI's original), or ``fn`` itself when it is not our wrapper."""
    if fn is not None and getattr(fn, _HOOK_MARK, False):
        return getattr(fn, "__wrapped__", None)
    return fn


def _run_free_memory_callbacks(state: dict) -> None:
    with state["lock"]:
        callbacks = list(state["callbacks"])
    for cb in callbacks:
        try:
            cb()
        except Exception:
            log.exception("comfyui-h3: free-memory callback %r failed", cb)


def _install_free_memory_hook(mm) -> bool:
    execution = _comfy("execution")  # core's prompt queue: its /free wake-up can be lost (queue_flags.py)
    if execution is not None and hasattr(execution, "PromptQueue"):
        install_flag_redelivery(execution.PromptQueue)
    state = _hook_state(mm)
    with state["lock"]:
        with _headless_hook_state["lock"]:  # callbacks registered before ComfyUI's modules were seen
            for cb in _headless_hook_state["callbacks"]:
                if not any(c is cb or c == cb for c in state["callbacks"]):
                    state["callbacks"].append(cb)
            _headless_hook_state["callbacks"].clear()
        current = getattr(mm, "unload_all_models", None)
        if current is None:
            return False
        if _is_ours(current):
            return True
        original = current
        local = state["local"]

        @functools.wraps(original)
        def unload_all_models(*args, **kwargs):
            depth = getattr(local, "depth", 0)
            local.depth = depth + 1
            try:
                return original(*args, **kwargs)
            finally:
                local.depth = depth
                if depth == 0:
                    _run_free_memory_callbacks(state)

        setattr(unload_all_models, _HOOK_MARK, True)
        state["original"] = original
        mm.unload_all_models = unload_all_models
        return True


def ensure_free_memory_hook() -> bool:
    """Install (or re-install) the unload_all_models wrapper. Returns False headless. Cheap; call before engine use."""
    mm = _comfy("comfy.model_management")
    if mm is None:
        return False
    return _install_free_memory_hook(mm)


def register_free_memory_hook(callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback()`` whenever ComfyUI unloads all models (POST /free, the Unload Models button, ...).

    Registering the same callable twice keeps one entry. Returns a function that unregisters it. Headless there is
    nothing to hook: the callback is kept so that a later :func:`ensure_free_memory_hook` inside ComfyUI activates it,
    and is otherwise never called.
    """
    if not callable(callback):
        raise TypeError(f"register_free_memory_hook: callback must be callable, got {type(callback).__name__}")
    mm = _comfy("comfy.model_management")
    state = _hook_state(mm) if mm is not None else _headless_hook_state
    with state["lock"]:
        if not any(cb is callback or cb == callback for cb in state["callbacks"]):
            state["callbacks"].append(callback)
    if mm is not None:
        _install_free_memory_hook(mm)

    def unregister() -> None:
        states = [_headless_hook_state]
        mm_now = _comfy("comfy.model_management")
        if mm_now is not None:
            states.append(_hook_state(mm_now))
        for st in states:
            with st["lock"]:
                st["callbacks"][:] = [cb for cb in st["callbacks"] if not (cb is callback or cb == callback)]

    return unregister

