"""Shared fixtures: the tiny MiniMax-H3 set the package builds itself, made once per test session."""

import os
import subprocess
import sys
import uuid

# Tiny models on a 2-core machine: one intra-op thread is several times faster than two fighting (and it is what
# spawned workers inherit through the environment).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # a plain checkout without `pip install -e .` still imports comfyui_h3
    sys.path.insert(0, REPO)


def pytest_collection_modifyitems(config, items):
    """A test that starts a real ComfyUI (the `comfy` fixture: the lane) is slow by nature: marked so here, beside the
    `@pytest.mark.slow` marks of the tests that take seconds (docs/TESTING.md: the fast subset)."""
    for item in items:
        if "comfy" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def empty_engine_registry():
    """No engine resident before the test and none after it (every worker stopped)."""
    from comfyui_h3.backend import engine as engine_module

    engine_module.shutdown_all()
    engine_module._ENGINES.clear()
    yield
    engine_module.shutdown_all()
    engine_module._ENGINES.clear()


@pytest.fixture(scope="session")
def tiny_h3_dir(tmp_path_factory):
    from comfyui_h3.backend.models.tiny import make_tiny_h3

    return make_tiny_h3(tmp_path_factory.mktemp("models") / "tiny-h3")


@pytest.fixture(scope="module")
def tiny_pipeline(tiny_h3_dir):
    """One rank's H3 pipeline on the tiny model, float32 on the CPU (a module's tests share it)."""
    from comfyui_h3.backend.pipelines.h3.family import h3_config

    return h3_config(str(tiny_h3_dir), dtype="float32").build_pipeline(0)


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    """A real ComfyUI serving this pack (tests/comfyui_lane.py), one per test module; the modules that use it skip
    themselves when COMFYUI_DIR is unset."""
    from comfyui_lane import running_comfyui

    with running_comfyui(tmp_path_factory.mktemp("comfyui")) as server:
        yield server


@pytest.fixture
def canned_engine(monkeypatch):
    """generate / edit get `_result()` without a model, and no model folder is resolved."""
    import comfyui_h3.cli as cli
    from cli_helpers import canned_result
    import comfyui_h3.cli_generate as cli_generate

    calls = []

    def run_on_engine(args, model_dir, request, desc, status=None, on_cancelled=None):
        calls.append(request)
        return canned_result()

    monkeypatch.setattr(cli_generate, "run_on_engine", run_on_engine)
    monkeypatch.setattr(cli, "_resolve_model", lambda name: "/nonexistent-model")
    return calls


@pytest.fixture
def full_filesystem(tmp_path):
    """A 64 KB tmpfs (needs root and mount rights in this container; skipped, saying so, otherwise)."""
    mount = tmp_path / f"full-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip() or 'mount failed'}); "
                    "test_cli_outputs.py covers the same path with an injected ENOSPC")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)
