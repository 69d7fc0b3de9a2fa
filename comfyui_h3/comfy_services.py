"""Adapters to ComfyUI services, with a headless fallback.

Everything the package needs from a running ComfyUI goes through this module: progress bars, the interrupt flag,
freeing ComfyUI's device memory, the "free memory" / "Unload Models" hook, model folders, and the input/output
directories. Nothing here imports ComfyUI at module import time, so the CLI, the tests and plain Python users can import
it without ComfyUI on the path.

How "ComfyUI is here" is decided (env ``COMFYUI_H3_COMFY``):

- ``auto`` (default): use a ComfyUI module only when it is already imported in this process (``sys.modules``). Inside
  ComfyUI that is always the case: main.py imports ``folder_paths``, ``comfy.utils``, ``comfy.model_management`` and
  ``comfy_execution.utils`` before it loads custom nodes. Importing them from a plain process instead would parse
  ComfyUI's CLI arguments, probe devices and log, which a CLI run must not do.
- ``import``: also try to import them (a Python user driving ComfyUI's modules by hand).
- ``off``: always headless.

Headless behaviour: progress lines on stderr, an interrupt flag that only :func:`request_interrupt` sets, model roots
from ``COMFYUI_H3_MODELS`` (``os.pathsep``-separated), ``./output`` and ``./input`` (or ``COMFYUI_H3_OUTPUT`` /
``COMFYUI_H3_INPUT``) as the output and input directories.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
import threading
import time
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

log = logging.getLogger("comfyui_h3")

ENV_MODE = "COMFYUI_H3_COMFY"
ENV_MODELS = "COMFYUI_H3_MODELS"
ENV_OUTPUT = "COMFYUI_H3_OUTPUT"
ENV_INPUT = "COMFYUI_H3_INPUT"

#: ComfyUI folder type we register for H3 checkpoints (``models/minimax_h3``; extra_model_paths.yaml may add more).
H3_FOLDER_TYPE = "minimax_h3"
#: Other ComfyUI folder types searched for H3 diffusers folders, in this order after ``minimax_h3``.
H3_EXTRA_FOLDER_TYPES = ("diffusers", "diffusion_models")
#: How deep below a root a model folder may sit (``root/a``, ``root/org/a``, ``root/org/a/b``).
MODEL_SCAN_DEPTH = 3

__all__ = [
    "H3Interrupted",
    "UnsafePathError",
    "H3ModelNotFound",
    "comfy_available",
    "ProgressReporter",
    "interrupt_requested",
    "raise_if_interrupted",
    "request_interrupt",
    "clear_interrupt",
    "interrupt_exception_types",
    "free_comfy_device_memory",
    "register_free_memory_hook",
    "ensure_free_memory_hook",
    "register_h3_model_folder",
    "h3_model_roots",
    "h3_model_dirs",
    "is_h3_model_dir",
    "resolve_h3_model",
    "output_directory",
    "input_directory",
    "temp_directory",
    "resolve_in_directory",
    "resolve_output_path",
    "resolve_input_path",
]


class H3Interrupted(Exception):
    """Raised by :func:`raise_if_interrupted` when running without ComfyUI (ComfyUI's own exception is used inside it)."""


class UnsafePathError(ValueError):
    """A user-supplied name would resolve outside the directories it is allowed to reach."""


class H3ModelNotFound(FileNotFoundError):
    """No MiniMax-H3 diffusers folder under the known model roots matches the given name."""


# ----------------------------------------------------------------------------------------------------------------------
# Lazy access to ComfyUI modules


def _mode() -> str:
    mode = os.environ.get(ENV_MODE, "auto").strip().lower()
    return mode if mode in ("auto", "import", "off") else "auto"


def _comfy(name: str):
    """The ComfyUI module ``name`` (e.g. ``"comfy.model_management"``), or None when running headless."""
    mode = _mode()
    if mode == "off":
        return None
    module = sys.modules.get(name)
    if module is not None or mode != "import":
        return module
    try:
        return importlib.import_module(name)
    except Exception:  # ImportError, or ComfyUI failing to initialise outside its own process
        return None


def comfy_available() -> bool:
    """True when this process runs inside ComfyUI (its model management and folder_paths are loaded)."""
    return _comfy("comfy.model_management") is not None and _comfy("folder_paths") is not None


# ----------------------------------------------------------------------------------------------------------------------
# Progress


class ProgressReporter:
    """Progress for one node run: ComfyUI's ``comfy.utils.ProgressBar`` when available, stderr lines otherwise.

    ``update(n)`` advances by ``n``; ``update_absolute(value, total=None, preview=None)`` sets the position (clamped to
    ``total``, as ComfyUI does). Inside ComfyUI the progress hook also checks the interrupt flag: called from the thread
    that created the reporter (the node's thread) an update raises ComfyUI's ``InterruptProcessingException`` exactly
    like a core node's progress bar. Called from any other thread (an engine event listener) it never raises: it sets
    the interrupt flag again (the hook cleared it when raising) so the node thread still sees the cancel at its next
    :func:`raise_if_interrupted`.

    ``node_id`` defaults to the node ComfyUI is executing when the reporter is created, so that updates sent from other
    threads are still attributed to it. Headless lines are throttled to one per ``min_interval`` seconds (the first and
    the last one always print).
    """

    def __init__(self, total: int, node_id: Optional[str] = None, desc: str = "H3", min_interval: float = 0.25,
                 stream=None):
        self.total = max(int(total), 0)
        self.current = 0
        self.desc = desc
        self.min_interval = float(min_interval)
        self._stream = stream
        self._thread = threading.get_ident()
        self._last_print = None  # (time, value) of the last headless line
        self._bar = None
        utils = _comfy("comfy.utils")
        if utils is not None and hasattr(utils, "ProgressBar"):
            if node_id is None:
                node_id = _executing_node_id()
            self._bar = utils.ProgressBar(self.total, node_id=node_id)
        self.node_id = node_id

    @property
    def uses_comfy(self) -> bool:
        return self._bar is not None

    def update(self, n: int = 1) -> None:
        self.update_absolute(self.current + n)

    def update_absolute(self, value: int, total: Optional[int] = None, preview=None) -> None:
        if total is not None:
            self.total = max(int(total), 0)
        value = min(max(int(value), 0), self.total)
        self.current = value
        if self._bar is None:
            self._print(value)
            return
        try:
            self._bar.update_absolute(value, self.total, preview)
        except Exception as exc:
            if threading.get_ident() == self._thread or not _is_comfy_interrupt(exc):
                raise
            # Another thread consumed the interrupt: hand it back to the node thread.
            mm = _comfy("comfy.model_management")
            if mm is not None and hasattr(mm, "interrupt_current_processing"):
                mm.interrupt_current_processing(True)

    def _print(self, value: int) -> None:
        now = time.monotonic()
        last = self._last_print
        final = value >= self.total
        if last is not None:
            if last[1] == value:
                return
            if not final and now - last[0] < self.min_interval:
                return
        self._last_print = (now, value)
        pct = 100.0 * value / self.total if self.total else 100.0
        stream = self._stream if self._stream is not None else sys.stderr
        try:
            stream.write(f"[comfyui-h3] {self.desc}: {value}/{self.total} ({pct:.0f}%)\n")
            stream.flush()
        except Exception:  # a closed stderr must not fail a generation
            pass


def _executing_node_id() -> Optional[str]:
    cu = _comfy("comfy_execution.utils")
    getter = getattr(cu, "get_executing_context", None) if cu is not None else None
    if getter is None:
        return None
    try:
        ctx = getter()
    except Exception:
        return None
    return getattr(ctx, "node_id", None) if ctx is not None else None


# ----------------------------------------------------------------------------------------------------------------------
# Interrupt

_headless_interrupt = threading.Event()


def request_interrupt() -> None:
    """Ask the running job to stop (CLI Ctrl-C, tests). Inside ComfyUI, POST /interrupt does the same."""
    _headless_interrupt.set()


def clear_interrupt() -> None:
    _headless_interrupt.clear()


def interrupt_requested() -> bool:
    """True when a stop was requested. Never raises and never clears the flag (safe to poll from any thread)."""
    if _headless_interrupt.is_set():
        return True
    mm = _comfy("comfy.model_management")
    fn = getattr(mm, "processing_interrupted", None) if mm is not None else None
    if fn is not None:
        try:
            return bool(fn())
        except Exception:
            return False
    return False


def interrupt_exception_types() -> Tuple[type, ...]:
    """The exception types that mean "stopped by the user" here: catch these to cancel the engine, then re-raise."""
    types: List[type] = [H3Interrupted]
    mm = _comfy("comfy.model_management")
    exc = getattr(mm, "InterruptProcessingException", None) if mm is not None else None
    if isinstance(exc, type):
        types.append(exc)
    return tuple(types)


def _is_comfy_interrupt(exc: BaseException) -> bool:
    mm = _comfy("comfy.model_management")
    cls = getattr(mm, "InterruptProcessingException", None) if mm is not None else None
    return isinstance(cls, type) and isinstance(exc, cls)


def raise_if_interrupted() -> None:
    """Raise when a stop was requested, consuming the request (as ComfyUI does, so the next prompt runs).

    Inside ComfyUI this raises ``comfy.model_management.InterruptProcessingException`` (ComfyUI then reports
    ``execution_interrupted`` instead of an error); headless it raises :class:`H3Interrupted`.
    """
    mm = _comfy("comfy.model_management")
    exc_cls = getattr(mm, "InterruptProcessingException", None) if mm is not None else None
    if _headless_interrupt.is_set():
        _headless_interrupt.clear()
        if isinstance(exc_cls, type):
            raise exc_cls()
        raise H3Interrupted("interrupted")
    if mm is None:
        return
    thrower = getattr(mm, "throw_exception_if_processing_interrupted", None)
    if thrower is not None:
        thrower()
    elif interrupt_requested():
        if hasattr(mm, "interrupt_current_processing"):
            mm.interrupt_current_processing(False)
        raise (exc_cls() if isinstance(exc_cls, type) else H3Interrupted("interrupted"))


# ----------------------------------------------------------------------------------------------------------------------
# Device memory


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
# the wrapper if something restored the original (core's hook_breaker restores only `cast_to` in v0.8.0).

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



# ----------------------------------------------------------------------------------------------------------------------
# Model discovery

_MODEL_INDEX_FILES = ("model_index.json", "modular_model_index.json")
_TRANSFORMER_DIRS = ("transformer", "transformer_ref")


def _norm(path: str) -> str:
    return os.path.normpath(os.path.abspath(os.path.expanduser(path)))


def _unique(paths: Iterable[str]) -> List[str]:
    out: List[str] = []
    seen = set()
    for p in paths:
        key = os.path.normcase(p)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def register_h3_model_folder() -> Optional[str]:
    """Register the ``minimax_h3`` folder type with ComfyUI (``<models_dir>/minimax_h3``), keeping entries that
    extra_model_paths.yaml already added. Idempotent; returns the default folder, or None headless. Creates nothing."""
    fp = _comfy("folder_paths")
    if fp is None:
        return None
    models_dir = getattr(fp, "models_dir", None)
    if models_dir is None:
        return None
    default = os.path.join(models_dir, H3_FOLDER_TYPE)
    add = getattr(fp, "add_model_folder_path", None)
    table = getattr(fp, "folder_names_and_paths", None)
    if add is not None:
        add(H3_FOLDER_TYPE, default)
    elif isinstance(table, dict):
        paths, exts = table.get(H3_FOLDER_TYPE, ([], set()))
        if default not in paths:
            paths.append(default)
        table[H3_FOLDER_TYPE] = (paths, exts)
    return default


def _env_roots() -> List[str]:
    raw = os.environ.get(ENV_MODELS, "")
    return [_norm(p) for p in raw.split(os.pathsep) if p.strip()]


def h3_model_roots() -> List[str]:
    """Absolute folders searched for H3 models, first match wins: ComfyUI's ``minimax_h3``, ``diffusers`` and
    ``diffusion_models`` folder paths (extra_model_paths.yaml entries included), then ``COMFYUI_H3_MODELS``."""
    roots: List[str] = []
    fp = _comfy("folder_paths")
    if fp is not None:
        register_h3_model_folder()
        get = getattr(fp, "get_folder_paths", None)
        for kind in (H3_FOLDER_TYPE,) + H3_EXTRA_FOLDER_TYPES:
            try:
                roots.extend(get(kind) if get is not None else fp.folder_names_and_paths[kind][0])
            except (KeyError, AttributeError, TypeError):
                continue
    roots.extend(_env_roots())
    return _unique(_norm(r) for r in roots)


def is_h3_model_dir(path: str) -> bool:
    """A diffusers folder of MiniMax-H3: model_index.json (or modular_model_index.json) plus transformer/ or
    transformer_ref/."""
    try:
        has_index = any(os.path.isfile(os.path.join(path, f)) for f in _MODEL_INDEX_FILES)
        return has_index and any(os.path.isdir(os.path.join(path, d)) for d in _TRANSFORMER_DIRS)
    except OSError:
        return False


def _scan(root: str, depth: int) -> List[str]:
    """Relative ('/'-joined) names of H3 folders below ``root``; a qualifying folder is not descended into."""
    found: List[str] = []

    def walk(folder: str, rel: Tuple[str, ...], left: int) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                if not entry.is_dir():
                    continue
            except OSError:
                continue
            sub = rel + (entry.name,)
            if is_h3_model_dir(entry.path):
                found.append("/".join(sub))
            elif left > 1:
                walk(entry.path, sub, left - 1)

    walk(root, (), depth)
    return found


def h3_model_dirs(roots: Optional[Sequence[str]] = None) -> List[str]:
    """Names of MiniMax-H3 diffusers folders under the model roots, relative to their root ('/' separators), sorted,
    each once (the first root holding a name wins, as in ComfyUI). A root that is itself a model folder is listed by
    its base name. Use these names as the loader's combo values; :func:`resolve_h3_model` turns them into paths."""
    names: List[str] = []
    for root in (h3_model_roots() if roots is None else [_norm(r) for r in roots]):
        if not os.path.isdir(root):
            continue
        if is_h3_model_dir(root):
            names.append(os.path.basename(root))
        names.extend(_scan(root, MODEL_SCAN_DEPTH))
    return sorted(set(names), key=lambda n: (n.lower(), n))


def _inside(base: str, path: str) -> bool:
    try:
        return os.path.commonpath([os.path.normcase(base), os.path.normcase(path)]) == os.path.normcase(base)
    except ValueError:  # different drives on Windows
        return False


def _check_relative(name: str, what: str) -> List[str]:
    if "\x00" in name:
        raise UnsafePathError(f"{what} {name!r} contains a NUL byte")
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise UnsafePathError(f"{what} {name!r} must not contain '..' (it would leave its folder)")
    return parts


def resolve_h3_model(name_or_path: str, allow_explicit_path: bool = False,
                     roots: Optional[Sequence[str]] = None) -> str:
    """Absolute path of an H3 diffusers folder.

    ``name_or_path`` is a name from :func:`h3_model_dirs` (relative to a model root), or an absolute path inside one of
    the roots. With ``allow_explicit_path=True`` (CLI and Python users, never a node input) any absolute path, or a path
    relative to the current directory that exists, is accepted as well. A name never escapes its root: '..' is refused
    (:class:`UnsafePathError`). Raises :class:`H3ModelNotFound` when nothing qualifies.
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"model name must be a string, got {type(name_or_path).__name__}")
    name = os.fspath(name_or_path).strip()
    if not name:
        raise H3ModelNotFound("no MiniMax-H3 model given (empty name)")
    root_list = h3_model_roots() if roots is None else [_norm(r) for r in roots]

    if allow_explicit_path:
        explicit = _norm(name)
        if (os.path.isabs(os.path.expanduser(name)) or os.path.exists(explicit)) and os.path.isdir(explicit):
            if is_h3_model_dir(explicit):
                return explicit
            raise H3ModelNotFound(
                f"{explicit} is not a MiniMax-H3 diffusers folder (needs model_index.json or modular_model_index.json "
                f"and transformer/ or transformer_ref/)")
        if os.path.isabs(os.path.expanduser(name)) and not os.path.exists(explicit):
            raise H3ModelNotFound(f"MiniMax-H3 model folder not found: {explicit}")

    if os.path.isabs(name):
        if "\x00" in name:
            raise UnsafePathError(f"model path {name!r} contains a NUL byte")
        path = os.path.normpath(name)
        if not any(_inside(root, path) for root in root_list):
            raise UnsafePathError(f"model path {name!r} is outside ComfyUI's model folders {root_list}")
        if is_h3_model_dir(path):
            return path
        raise H3ModelNotFound(f"{path} is not a MiniMax-H3 diffusers folder")

    parts = _check_relative(name, "model name")
    if not parts:
        raise H3ModelNotFound(f"model name {name!r} names no folder")
    for root in root_list:
        candidate = os.path.normpath(os.path.join(root, *parts))
        if _inside(root, candidate) and candidate != root and is_h3_model_dir(candidate):
            return candidate
        if len(parts) == 1 and parts[0] == os.path.basename(root) and is_h3_model_dir(root):
            return root
    available = h3_model_dirs(root_list)
    raise H3ModelNotFound(
        f"MiniMax-H3 model {name!r} not found under {root_list or '(no model roots)'}; "
        f"available: {available[:10] or 'none'}. Put the diffusers folder (model_index.json + transformer/) in "
        f"ComfyUI/models/{H3_FOLDER_TYPE}/ or set {ENV_MODELS}.")


# ----------------------------------------------------------------------------------------------------------------------
# Input / output directories


def _directory(getter: str, env: str, default: str) -> str:
    fp = _comfy("folder_paths")
    fn = getattr(fp, getter, None) if fp is not None else None
    if fn is not None:
        return _norm(fn())
    return _norm(os.environ.get(env) or default)


def output_directory() -> str:
    """ComfyUI's output directory (``--output-directory`` respected), headless ``$COMFYUI_H3_OUTPUT`` or ./output."""
    return _directory("get_output_directory", ENV_OUTPUT, "output")


def input_directory() -> str:
    """ComfyUI's input directory, headless ``$COMFYUI_H3_INPUT`` or ./input."""
    return _directory("get_input_directory", ENV_INPUT, "input")


def temp_directory() -> str:
    """ComfyUI's temp directory (previews), headless ./temp."""
    return _directory("get_temp_directory", "COMFYUI_H3_TEMP", "temp")


def resolve_in_directory(base: str, relpath: str, must_exist: bool = False) -> str:
    """``base/relpath`` as an absolute path, refusing anything that leaves ``base`` ('..', absolute paths, drive
    letters): :class:`UnsafePathError`. With ``must_exist`` a missing file raises FileNotFoundError."""
    if not isinstance(relpath, (str, os.PathLike)):
        raise TypeError(f"path must be a string, got {type(relpath).__name__}")
    rel = os.fspath(relpath)
    if os.path.isabs(rel) or os.path.splitdrive(rel)[0] or rel.replace("\\", "/").startswith("/"):
        raise UnsafePathError(f"path {rel!r} must be relative to {base}")
    parts = _check_relative(rel, "path")
    base = _norm(base)
    path = os.path.normpath(os.path.join(base, *parts))
    if not _inside(base, path):
        raise UnsafePathError(f"path {rel!r} leaves {base}")
    if must_exist and not os.path.exists(path):
        raise FileNotFoundError(f"{rel!r} not found in {base}")
    return path


def resolve_output_path(relpath: str) -> str:
    """A path inside the output directory (for saving); never outside it."""
    return resolve_in_directory(output_directory(), relpath)


_ANNOTATIONS = (("[input]", input_directory), ("[output]", output_directory), ("[temp]", temp_directory))


def resolve_input_path(name: str, must_exist: bool = True) -> str:
    """A file picked by a loader node: ``name`` relative to the input directory, or with ComfyUI's annotation suffix
    (``"clip.mp4 [output]"``, ``" [input]"``, ``" [temp]"``) relative to that directory. Never outside it."""
    if not isinstance(name, str):
        raise TypeError(f"path must be a string, got {type(name).__name__}")
    stripped = name.rstrip()
    for tag, directory in _ANNOTATIONS:
        if stripped.endswith(tag):
            return resolve_in_directory(directory(), stripped[: -len(tag)].rstrip(), must_exist=must_exist)
    return resolve_in_directory(input_directory(), name, must_exist=must_exist)

