"""pytest plugin for the integration lane (.ci/lane loads it with `-p lane_select --lane-only`): keeps only the tests
that need a real ComfyUI, so the lane does not run again what the README's test command already ran.

A test needs one when it uses the `comfy` fixture (directly or through another fixture), uses a fixture that reaches
it at run time (LANE_FIXTURES), or carries a skipif whose reason names COMFYUI_DIR (the lane's own NO_COMFYUI and the
like). With --lane-only and no such test among those collected the run fails, rather than passing on nothing."""

from __future__ import annotations

import pytest

# Fixtures that get `comfy` through request.getfixturevalue (invisible in an item's fixture closure).
LANE_FIXTURES = {"comfy", "comfy_lane"}


def pytest_addoption(parser):
    parser.addoption("--lane-only", action="store_true",
                     help="run only the tests that need a real ComfyUI (COMFYUI_DIR); the rest are deselected")


def needs_comfyui(item) -> bool:
    if LANE_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    return any("COMFYUI_DIR" in str(mark.kwargs.get("reason", "")) for mark in item.iter_markers("skipif"))


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--lane-only"):
        return
    keep = [item for item in items if needs_comfyui(item)]
    dropped = [item for item in items if not needs_comfyui(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep
    if not keep:
        raise pytest.UsageError("--lane-only: none of the collected tests needs a real ComfyUI (COMFYUI_DIR)")
