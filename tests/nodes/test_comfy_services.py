"""comfyui_h3.comfy_services: headless fallbacks, and the ComfyUI paths through fake ComfyUI modules.

The package is loaded from its folder (a fresh copy per test, so module-level state never leaks between tests); the fake
ComfyUI modules are put into sys.modules with monkeypatch, which is exactly how the adapters find a running ComfyUI.
"""

import functools
import importlib.util
import io
import os
import sys
import threading
import types
from pathlib import Path

import pytest
from repo_paths import REPO

SERVICES_DIR = REPO / "comfyui_h3" / "comfy_services"
COMFY_MODULES = ("comfy", "comfy.utils", "comfy.model_management", "comfy_execution", "comfy_execution.utils",
                 "folder_paths")
_copies = 0


def load_services():
    global _copies
    _copies += 1
    # A subpackage of comfyui_h3, as installed: its lazy relative imports (``..install_samples``, ``..backend``) resolve
    import comfyui_h3  # noqa: F401  (light: no ComfyUI, no torch)

    name = f"comfyui_h3._h3_comfy_services_under_test_{_copies}"
    spec = importlib.util.spec_from_file_location(name, SERVICES_DIR / "__init__.py",
                                                  submodule_search_locations=[str(SERVICES_DIR)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the package's modules import each other relatively, under this unique name
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def headless(monkeypatch):
    for name in COMFY_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    for env in ("COMFYUI_H3_COMFY", "COMFYUI_H3_MODELS", "COMFYUI_H3_OUTPUT", "COMFYUI_H3_INPUT", "COMFYUI_H3_TEMP"):
        monkeypatch.delenv(env, raising=False)
    return load_services()


def make_model(path: Path, index="model_index.json", transformer="transformer"):
    path.mkdir(parents=True, exist_ok=True)
    if index:
        (path / index).write_text('{"_class_name": "MiniMaxH3Pipeline"}')
    if transformer:
        (path / transformer).mkdir(exist_ok=True)
    return path


# ----------------------------------------------------------------------------------------------------------------------
# headless


def test_module_import_does_not_import_comfy(headless):
    assert not any(name in sys.modules for name in COMFY_MODULES)
    assert headless.comfy_available() is False


def test_headless_progress_prints_lines(headless, capsys):
    bar = headless.ProgressReporter(4, desc="denoise", min_interval=0.0)
    assert not bar.uses_comfy
    bar.update()
    bar.update(2)
    bar.update_absolute(10)  # clamped to total, as ComfyUI does
    err = capsys.readouterr().err.splitlines()
    assert err == ["[comfyui-h3] denoise: 1/4 (25%)", "[comfyui-h3] denoise: 3/4 (75%)",
                   "[comfyui-h3] denoise: 4/4 (100%)"]
    assert bar.current == 4


def test_headless_progress_throttles_but_prints_first_and_last(headless):
    out = io.StringIO()
    bar = headless.ProgressReporter(100, min_interval=3600, stream=out)
    for _ in range(100):
        bar.update()
    lines = out.getvalue().splitlines()
    assert lines == ["[comfyui-h3] H3: 1/100 (1%)", "[comfyui-h3] H3: 100/100 (100%)"]


def test_headless_progress_total_change(headless):
    out = io.StringIO()
    bar = headless.ProgressReporter(2, min_interval=0, stream=out)
    bar.update_absolute(1, total=5)
    assert out.getvalue().splitlines() == ["[comfyui-h3] H3: 1/5 (20%)"]


def test_headless_interrupt(headless):
    assert headless.interrupt_requested() is False
    headless.raise_if_interrupted()  # nothing requested: no exception
    headless.request_interrupt()
    assert headless.interrupt_requested() is True
    assert headless.interrupt_requested() is True  # polling never clears
    with pytest.raises(headless.H3Interrupted):
        headless.raise_if_interrupted()
    assert headless.interrupt_requested() is False  # raising consumed the request
    assert headless.interrupt_exception_types() == (headless.H3Interrupted,)


def test_headless_memory_services_are_noops(headless):
    calls = []
    assert headless.free_comfy_device_memory("cuda:0") is False
    unregister = headless.register_free_memory_hook(lambda: calls.append(1))
    assert headless.ensure_free_memory_hook() is False
    unregister()
    assert calls == []
    with pytest.raises(TypeError):
        headless.register_free_memory_hook("not callable")


def test_headless_discovery_over_env_roots(headless, tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    make_model(a / "MiniMax-H3")
    make_model(a / "org" / "H3-modular", index="modular_model_index.json", transformer="transformer_ref")
    make_model(a / "index-only", transformer=None)
    make_model(a / "transformer-only", index=None)
    make_model(a / ".hidden-model")
    make_model(a / "x" / "y" / "z" / "too-deep")
    make_model(a / "MiniMax-H3" / "nested-inside-model")  # a model folder is not descended into
    make_model(b / "MiniMax-H3")  # same name in a later root: listed once, first root wins
    make_model(b / "other")
    (b / "file.safetensors").write_bytes(b"")
    monkeypatch.setenv("COMFYUI_H3_MODELS", os.pathsep.join([str(a), str(b), str(tmp_path / "missing")]))

    assert headless.h3_model_roots() == [str(a), str(b), str(tmp_path / "missing")]
    assert headless.h3_model_dirs() == ["MiniMax-H3", "org/H3-modular", "other"]
    assert headless.resolve_h3_model("MiniMax-H3") == str(a / "MiniMax-H3")
    assert headless.resolve_h3_model("org/H3-modular") == str(a / "org" / "H3-modular")
    assert headless.resolve_h3_model("other") == str(b / "other")
    assert headless.resolve_h3_model(str(b / "other")) == str(b / "other")  # absolute, inside a root


def test_root_that_is_itself_a_model(headless, tmp_path, monkeypatch):
    root = make_model(tmp_path / "H3-direct")
    monkeypatch.setenv("COMFYUI_H3_MODELS", str(root))
    assert headless.h3_model_dirs() == ["H3-direct"]
    assert headless.resolve_h3_model("H3-direct") == str(root)


def test_model_resolver_rejects_escapes(headless, tmp_path, monkeypatch):
    root = tmp_path / "models"
    make_model(root / "ok")
    outside = make_model(tmp_path / "outside")
    monkeypatch.setenv("COMFYUI_H3_MODELS", str(root))
    for bad in ("../outside", "ok/../../outside", "..\\outside", "ok/../.."):
        with pytest.raises(headless.UnsafePathError):
            headless.resolve_h3_model(bad)
    with pytest.raises(headless.UnsafePathError):
        headless.resolve_h3_model(str(outside))  # absolute path outside every root (a node input)
    with pytest.raises(headless.H3ModelNotFound, match="available: \\['ok'\\]"):
        headless.resolve_h3_model("nope")
    with pytest.raises(headless.H3ModelNotFound):
        headless.resolve_h3_model("")
    with pytest.raises(headless.H3ModelNotFound):
        headless.resolve_h3_model(str(root))  # the root itself is no model
    # CLI users may name any folder explicitly, and it still has to be an H3 folder
    assert headless.resolve_h3_model(str(outside), allow_explicit_path=True) == str(outside)
    monkeypatch.chdir(tmp_path)
    assert headless.resolve_h3_model("outside", allow_explicit_path=True) == str(outside)
    (tmp_path / "plain").mkdir()
    with pytest.raises(headless.H3ModelNotFound, match="not a MiniMax-H3"):
        headless.resolve_h3_model(str(tmp_path / "plain"), allow_explicit_path=True)


def test_headless_directories_and_safe_paths(headless, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert headless.output_directory() == str(tmp_path / "output")
    assert headless.input_directory() == str(tmp_path / "input")
    monkeypatch.setenv("COMFYUI_H3_OUTPUT", str(tmp_path / "out2"))
    assert headless.output_directory() == str(tmp_path / "out2")

    assert headless.resolve_output_path("h3/clip_00001.mp4") == str(tmp_path / "out2" / "h3" / "clip_00001.mp4")
    for bad in ("../x.mp4", "a/../../x.mp4", "/etc/passwd", "..", "a/..\\..\\x"):
        with pytest.raises(headless.UnsafePathError):
            headless.resolve_output_path(bad)

    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "in.mp4").write_bytes(b"x")
    (tmp_path / "out2" / "made.mp4").parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "out2" / "made.mp4").write_bytes(b"x")
    assert headless.resolve_input_path("in.mp4") == str(tmp_path / "input" / "in.mp4")
    assert headless.resolve_input_path("made.mp4 [output]") == str(tmp_path / "out2" / "made.mp4")
    with pytest.raises(FileNotFoundError):
        headless.resolve_input_path("missing.mp4")
    with pytest.raises(headless.UnsafePathError):
        headless.resolve_input_path("../input/in.mp4 [output]")


def test_off_mode_ignores_loaded_comfy(headless, monkeypatch):
    fake = FakeComfy(monkeypatch, Path("/nonexistent"))
    monkeypatch.setenv("COMFYUI_H3_COMFY", "off")
    assert headless.comfy_available() is False
    assert not headless.ProgressReporter(3, stream=io.StringIO()).uses_comfy
    monkeypatch.setenv("COMFYUI_H3_COMFY", "auto")
    assert headless.comfy_available() is True
    assert fake.mm.unload_calls == 0


# ----------------------------------------------------------------------------------------------------------------------
# fake ComfyUI


class FakeComfy:
    """Just the surface of ComfyUI v0.8.0 the adapters use, with the same semantics."""

    def __init__(self, monkeypatch, base: Path):
        self.progress = []
        self.executing_node = "17"
        fake = self

        comfy = types.ModuleType("comfy")
        utils = types.ModuleType("comfy.utils")
        mm = types.ModuleType("comfy.model_management")
        ce = types.ModuleType("comfy_execution")
        ceu = types.ModuleType("comfy_execution.utils")
        fp = types.ModuleType("folder_paths")

        class InterruptProcessingException(Exception):
            pass

        mm.InterruptProcessingException = InterruptProcessingException
        mm.interrupt_processing = False
        mm.unload_calls = 0
        mm.free_calls = []
        mm.empty_calls = 0

        def interrupt_current_processing(value=True):
            mm.interrupt_processing = value

        def processing_interrupted():
            return mm.interrupt_processing

        def throw_exception_if_processing_interrupted():
            if mm.interrupt_processing:
                mm.interrupt_processing = False
                raise InterruptProcessingException()

        def free_memory(memory_required, device, keep_loaded=[]):
            mm.free_calls.append((memory_required, device))
            return []

        def unload_all_models():
            mm.unload_calls += 1

        def soft_empty_cache(force=False):
            mm.empty_calls += 1

        for fn in (interrupt_current_processing, processing_interrupted, throw_exception_if_processing_interrupted,
                   free_memory, unload_all_models, soft_empty_cache):
            setattr(mm, fn.__name__, fn)

        class ProgressBar:  # ComfyUI's hook checks (and consumes) the interrupt flag on every update
            def __init__(self, total, node_id=None):
                self.total, self.current, self.node_id = total, 0, node_id

            def update_absolute(self, value, total=None, preview=None):
                if total is not None:
                    self.total = total
                self.current = min(value, self.total)
                throw_exception_if_processing_interrupted()
                fake.progress.append((self.current, self.total, self.node_id))

            def update(self, value):
                self.update_absolute(self.current + value)

        utils.ProgressBar = ProgressBar

        class Ctx:
            def __init__(self, node_id):
                self.prompt_id, self.node_id, self.list_index = "p1", node_id, None

        ceu.get_executing_context = lambda: Ctx(fake.executing_node) if fake.executing_node else None

        fp.base_path = str(base)
        fp.models_dir = str(base / "models")
        fp.folder_names_and_paths = {
            "diffusion_models": ([str(base / "models" / "unet"), str(base / "models" / "diffusion_models")], {".pt"}),
            "diffusers": ([str(base / "models" / "diffusers")], ["folder"]),
        }

        def add_model_folder_path(folder_name, full_folder_path, is_default=False):
            if folder_name in fp.folder_names_and_paths:
                paths = fp.folder_names_and_paths[folder_name][0]
                if full_folder_path not in paths:
                    paths.insert(0, full_folder_path) if is_default else paths.append(full_folder_path)
            else:
                fp.folder_names_and_paths[folder_name] = ([full_folder_path], set())

        fp.add_model_folder_path = add_model_folder_path
        fp.get_folder_paths = lambda name: fp.folder_names_and_paths[name][0][:]
        fp.get_output_directory = lambda: str(base / "output")
        fp.get_input_directory = lambda: str(base / "input")
        fp.get_temp_directory = lambda: str(base / "temp")

        comfy.utils, comfy.model_management, ce.utils = utils, mm, ceu
        for name, module in (("comfy", comfy), ("comfy.utils", utils), ("comfy.model_management", mm),
                             ("comfy_execution", ce), ("comfy_execution.utils", ceu), ("folder_paths", fp)):
            monkeypatch.setitem(sys.modules, name, module)
        self.mm, self.fp, self.original_unload = mm, fp, unload_all_models


@pytest.fixture
def comfy(headless, monkeypatch, tmp_path):
    return FakeComfy(monkeypatch, tmp_path / "ComfyUI"), headless


def test_progress_uses_comfy_progressbar(comfy):
    fake, svc = comfy
    bar = svc.ProgressReporter(5)
    assert bar.uses_comfy and bar.node_id == "17"  # taken from the executing context
    bar.update()
    bar.update(2)
    bar.update_absolute(9)
    svc.ProgressReporter(2, node_id="3").update()
    assert fake.progress == [(1, 5, "17"), (3, 5, "17"), (5, 5, "17"), (1, 2, "3")]


def test_progress_update_interrupt_semantics(comfy):
    fake, svc = comfy
    bar = svc.ProgressReporter(10)
    fake.mm.interrupt_processing = True
    with pytest.raises(fake.mm.InterruptProcessingException):  # node thread: like a core node's progress bar
        bar.update()
    assert fake.mm.interrupt_processing is False

    fake.mm.interrupt_processing = True
    errors = []

    def other_thread():
        try:
            bar.update()
        except BaseException as exc:  # pragma: no cover - the assertion below reports it
            errors.append(exc)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert errors == []
    assert fake.mm.interrupt_processing is True  # handed back for the node thread
    with pytest.raises(fake.mm.InterruptProcessingException):
        svc.raise_if_interrupted()


def test_interrupt_uses_comfy_flag(comfy):
    fake, svc = comfy
    assert svc.comfy_available()
    assert svc.interrupt_requested() is False
    svc.raise_if_interrupted()
    fake.mm.interrupt_processing = True
    assert svc.interrupt_requested() is True
    assert fake.mm.interrupt_processing is True  # the check does not consume the flag
    assert fake.mm.InterruptProcessingException in svc.interrupt_exception_types()
    with pytest.raises(fake.mm.InterruptProcessingException):
        svc.raise_if_interrupted()
    assert fake.mm.interrupt_processing is False
    svc.request_interrupt()  # our own flag raises ComfyUI's exception inside ComfyUI
    with pytest.raises(fake.mm.InterruptProcessingException):
        svc.raise_if_interrupted()


def test_unload_hook_calls_callbacks_once_per_call(comfy, caplog):
    fake, svc = comfy
    mm = fake.mm
    calls = []

    def cb():
        calls.append("a")

    unregister = svc.register_free_memory_hook(cb)
    wrapper = mm.unload_all_models
    assert wrapper is not fake.original_unload and wrapper.__wrapped__ is fake.original_unload
    svc.register_free_memory_hook(cb)  # same callback again: one entry, no second wrapper
    assert svc.ensure_free_memory_hook() is True
    assert mm.unload_all_models is wrapper

    mm.unload_all_models()  # what main.py's prompt_worker does after POST /free {"unload_models": true}
    mm.unload_all_models()
    assert (mm.unload_calls, calls) == (2, ["a", "a"])

    # a second copy of this module (ComfyUI loads the pack by path; Python users import comfyui_h3) shares the hook
    other = load_services()
    other.register_free_memory_hook(lambda: calls.append("b"))
    assert mm.unload_all_models is wrapper
    mm.unload_all_models()
    assert (mm.unload_calls, calls[2:]) == (3, ["a", "b"])

    # a failing callback is logged, never raised into ComfyUI's prompt worker, and the others still run
    def boom():
        raise RuntimeError("engine already gone")

    svc.register_free_memory_hook(boom)
    mm.unload_all_models()
    assert calls[4:] == ["a", "b"] and "engine already gone" in caplog.text

    unregister()
    del calls[:]
    mm.unload_all_models()
    assert calls == ["b"]


def test_unload_hook_survives_foreign_wrappers(comfy):
    fake, svc = comfy
    mm = fake.mm
    calls = []
    svc.register_free_memory_hook(lambda: calls.append(1))
    ours = mm.unload_all_models

    @functools.wraps(ours)
    def polite(*a, **k):  # another pack wrapping with functools.wraps: we see ourselves through __wrapped__
        return ours(*a, **k)

    mm.unload_all_models = polite
    svc.ensure_free_memory_hook()
    assert mm.unload_all_models is polite
    mm.unload_all_models()
    assert calls == [1]

    def rude():  # no __wrapped__: we wrap again, and the thread-local guard still runs callbacks once
        return polite()

    mm.unload_all_models = rude
    svc.ensure_free_memory_hook()
    assert mm.unload_all_models is not rude
    mm.unload_all_models()
    assert calls == [1, 1] and mm.unload_calls == 2

    mm.unload_all_models = fake.original_unload  # something restored the original: ensure re-installs
    svc.ensure_free_memory_hook()
    mm.unload_all_models()
    assert calls == [1, 1, 1]


class CorePromptQueue:
    """The flag half of core's execution.PromptQueue (v0.8.0 and v0.33.0), same locks and wake-ups."""

    def __init__(self):
        self.mutex = threading.RLock()
        self.not_empty = threading.Condition(self.mutex)
        self.queue, self.flags = [], {}

    def get(self, timeout=None):
        with self.not_empty:
            while len(self.queue) == 0:
                self.not_empty.wait(timeout=timeout)
                if timeout is not None and len(self.queue) == 0:
                    return None
            return self.queue.pop(0)

    def set_flag(self, name, data):
        with self.mutex:
            self.flags[name] = data
            self.not_empty.notify()

    def get_flags(self, reset=True):
        with self.mutex:
            ret, self.flags = self.flags, {}
            return ret


def _unload_seen_after_a_flag_set_mid_gc(queue_class, within_s: float) -> bool:
    """main.py's prompt worker loop, with POST /free's flag set while it is in its gc step (between get_flags() and
    the next wait): True when the worker reads the flag within `within_s`."""
    q = queue_class()
    in_gc, end_gc, unloaded, stop = (threading.Event() for _ in range(4))

    def prompt_worker():
        first = True
        while not stop.is_set():
            q.get(timeout=60.0)
            if q.get_flags().get("unload_models"):
                unloaded.set()
                return
            if first:  # gc.collect(), soft_empty_cache() ...
                first = False
                in_gc.set()
                end_gc.wait(10)

    thread = threading.Thread(target=prompt_worker, daemon=True)
    thread.start()
    with q.mutex:
        q.not_empty.notify()  # an empty get() returns: the worker goes into its gc step
    assert in_gc.wait(10)
    q.set_flag("unload_models", True)  # POST /free, while no one waits on the queue
    end_gc.set()
    seen = unloaded.wait(within_s)
    stop.set()
    with q.mutex:
        q.flags["unload_models"] = True
        q.not_empty.notify()  # let a worker that slept through it finish
    thread.join(10)
    return seen


def test_a_free_set_while_the_prompt_worker_is_between_loops_is_not_slept_through(comfy, monkeypatch):
    fake, svc = comfy
    assert not _unload_seen_after_a_flag_set_mid_gc(CorePromptQueue, within_s=1.0)  # core alone loses the wake-up

    class PatchedQueue(CorePromptQueue):
        pass

    execution = types.ModuleType("execution")
    execution.PromptQueue = PatchedQueue
    monkeypatch.setitem(sys.modules, "execution", execution)
    assert svc.ensure_free_memory_hook() is True
    wrapped = PatchedQueue.set_flag
    assert svc.ensure_free_memory_hook() is True and PatchedQueue.set_flag is wrapped  # wrapped once
    assert _unload_seen_after_a_flag_set_mid_gc(PatchedQueue, within_s=20.0)  # re-notified: read in ~0.25 s


def test_headless_registration_moves_to_comfy(headless, monkeypatch, tmp_path):
    calls = []
    headless.register_free_memory_hook(lambda: calls.append(1))
    fake = FakeComfy(monkeypatch, tmp_path)
    assert headless.ensure_free_memory_hook() is True
    fake.mm.unload_all_models()
    assert calls == [1]


def test_free_device_memory_uses_comfy_without_firing_callbacks(comfy):
    import torch

    fake, svc = comfy
    calls = []
    svc.register_free_memory_hook(lambda: calls.append(1))
    assert svc.free_comfy_device_memory("cuda:1") is True
    assert svc.free_comfy_device_memory(0) is True
    assert fake.mm.free_calls == [(1e30, torch.device("cuda", 1)), (1e30, torch.device("cuda", 0))]
    assert fake.mm.empty_calls == 2
    assert svc.free_comfy_device_memory(torch.device("cpu")) is False
    with pytest.raises(ValueError):
        svc.free_comfy_device_memory("not-a-device")

    del fake.mm.free_memory  # older/other cores: fall back to unload_all_models, below our wrapper
    assert svc.free_comfy_device_memory("cuda:0") is True
    assert fake.mm.unload_calls == 1 and calls == []


def test_discovery_uses_comfy_folder_paths(comfy, tmp_path, monkeypatch):
    fake, svc = comfy
    models = tmp_path / "ComfyUI" / "models"
    extra = tmp_path / "extra"  # as extra_model_paths.yaml would add it
    fake.fp.add_model_folder_path("diffusion_models", str(extra))
    make_model(models / "minimax_h3" / "MiniMax-H3")
    make_model(models / "diffusion_models" / "H3-dm")
    make_model(models / "diffusers" / "H3-diffusers")
    make_model(extra / "H3-extra")
    env_root = tmp_path / "env"
    make_model(env_root / "H3-env")
    monkeypatch.setenv("COMFYUI_H3_MODELS", str(env_root))

    roots = svc.h3_model_roots()
    assert roots[0] == str(models / "minimax_h3")  # our folder type is registered and searched first
    assert fake.fp.folder_names_and_paths["minimax_h3"][0] == [str(models / "minimax_h3")]
    svc.h3_model_roots()
    assert fake.fp.folder_names_and_paths["minimax_h3"][0] == [str(models / "minimax_h3")]  # idempotent
    assert roots[1:] == [str(models / "diffusers"), str(models / "unet"), str(models / "diffusion_models"),
                         str(extra), str(env_root)]
    assert svc.h3_model_dirs() == ["H3-diffusers", "H3-dm", "H3-env", "H3-extra", "MiniMax-H3"]
    assert svc.resolve_h3_model("H3-extra") == str(extra / "H3-extra")
    with pytest.raises(svc.UnsafePathError):
        svc.resolve_h3_model("../minimax_h3/MiniMax-H3")


def test_extra_model_paths_entry_for_our_folder_type_is_kept(comfy, tmp_path):
    fake, svc = comfy
    yaml_root = tmp_path / "yaml_h3"
    fake.fp.add_model_folder_path("minimax_h3", str(yaml_root))  # extra_model_paths.yaml loads before custom nodes
    svc.register_h3_model_folder()
    assert fake.fp.folder_names_and_paths["minimax_h3"][0] == [
        str(yaml_root), str(tmp_path / "ComfyUI" / "models" / "minimax_h3")]


def test_directories_come_from_folder_paths(comfy, tmp_path):
    fake, svc = comfy
    base = tmp_path / "ComfyUI"
    assert svc.output_directory() == str(base / "output")
    assert svc.input_directory() == str(base / "input")
    assert svc.temp_directory() == str(base / "temp")
    assert svc.resolve_output_path("h3/a.mp4") == str(base / "output" / "h3" / "a.mp4")
    assert svc.resolve_input_path("a.png [temp]", must_exist=False) == str(base / "temp" / "a.png")
    with pytest.raises(svc.UnsafePathError):
        svc.resolve_output_path("../input/a.mp4")
