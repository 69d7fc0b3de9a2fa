"""The one H3 denoise driver (backend/pipelines/h3/denoise.py): an attention backend's per-request plan is built once
per layout (a request; an extension window) and reaches every DiT block's attention, and a dense result is the
same with or without it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from comfyui_h3.backend.attention import registry
from comfyui_h3.backend.attention.registry import AttentionBackend, get_backend
from comfyui_h3.backend.pipelines.h3.family import h3_config
from comfyui_h3.backend.pipelines.h3.request import H3ExtendRequest, H3Request

pytestmark = pytest.mark.slow  # every test here takes seconds on two cores (docs/TESTING.md)


@pytest.fixture
def planned(monkeypatch):
    """A backend that needs a plan: it records each plan it makes and the plan each attention call receives, and
    computes exactly what the "math" backend computes."""
    dense = get_backend("math")
    seen = {"made": [], "calls": []}

    def make_plan(layout):
        seen["made"].append(layout.seq_len)
        return ("tiles", len(seen["made"]), layout.seq_len)

    def attend(q, k, v, plan=None):
        seen["calls"].append(plan)
        return dense(q, k, v)

    monkeypatch.setitem(registry._BACKENDS, "test_planned", AttentionBackend("test_planned", attend, "test", make_plan))
    return seen


def test_plan_built_once_per_request_reaches_every_block(tiny_h3_dir, planned):
    request = H3Request(prompt="rain on a tin roof", num_frames=124, steps=3, seed=4, width=64, height=64,
                        decode=False)
    pipe = h3_config(str(tiny_h3_dir), dtype="float32", attention="test_planned").build_pipeline(0)
    got = pipe.run(request)
    assert len(planned["made"]) == 1  # once per request, not per step or per block
    plan = ("tiles", 1, planned["made"][0])
    layers = len(pipe.c.transformer_for("t2va").transformer_blocks)
    assert planned["calls"].count(plan) == 3 * layers  # every block of every step
    assert all(p is None for p in planned["calls"] if p != plan)  # the text refiner attends over the prompt alone
    want = h3_config(str(tiny_h3_dir), dtype="float32", attention="math").build_pipeline(0).run(request)
    assert torch.equal(got.video_latents, want.video_latents) and torch.equal(got.audio_latents, want.audio_latents)


def test_each_extension_window_gets_its_own_plan(tiny_h3_dir, planned):
    from comfyui_h3.backend.pipelines.h3.tasks.extend import run_extend

    rng = np.random.default_rng(1)
    video = rng.integers(0, 256, (124, 64, 96, 3), dtype=np.uint8)
    pipe = h3_config(str(tiny_h3_dir), dtype="float32", attention="test_planned").build_pipeline(0)
    result = run_extend(pipe, H3ExtendRequest(prompts=["waves"], added_frames=68, window_frames=56, overlap_frames=22,
                                              source_frames=video, steps=1, seed=2))
    windows = len(result.extend["windows"])
    assert windows == 2 and len(planned["made"]) == windows
    layers = len(pipe.c.transformer_for("extend").transformer_blocks)
    for number, seq_len in enumerate(planned["made"], 1):
        assert planned["calls"].count(("tiles", number, seq_len)) == layers  # one step per window
