"""Shared fixtures: the tiny MiniMax-H3 set the package builds itself, made once per test session."""

import os
import sys

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


@pytest.fixture(scope="session")
def tiny_h3_dir(tmp_path_factory):
    from comfyui_h3.backend.models.tiny import make_tiny_h3

    return make_tiny_h3(tmp_path_factory.mktemp("models") / "tiny-h3")


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    """A real ComfyUI serving this pack (tests/comfyui_lane.py), one per test module; the modules that use it skip
    themselves when COMFYUI_DIR is unset."""
    from comfyui_lane import running_comfyui

    with running_comfyui(tmp_path_factory.mktemp("comfyui")) as server:
        yield server
