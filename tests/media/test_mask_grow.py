"""Mask grow / feather (backend/media/mask_raster.py): equal to a brute-force evaluation of the definition on random
binary and soft masks (positive and negative grow, feather, both together), fast at large radii, Stop honoured
between chunks (directly and through H3 Mask Draw), and the same on CUDA when there is one.
Stop in a real ComfyUI: tests/lane/test_comfyui_media_hardening.py."""

import math
import time

import numpy as np
import pytest
import torch

from comfyui_h3 import comfy_services as services
from comfyui_h3.backend.media import mask_raster
from comfyui_h3.backend.media.mask_raster import grow_feather_invert
from comfyui_h3.nodes.mask_draw import H3MaskDraw
from comfyui_h3.video_types import H3Video


# -- the definition, evaluated directly (numpy, float64, one offset at a time) ------------------------------------------
def _dilate_reference(m: np.ndarray, r: int) -> np.ndarray:
    frames, height, width = m.shape
    padded = np.zeros((frames, height + 2 * r, width + 2 * r))  # outside the frame counts as 0
    padded[:, r:r + height, r:r + width] = m
    out = np.zeros_like(m, dtype=np.float64)
    for dy in range(-r, r + 1):
        for dx in range(-r, r + 1):
            if dx * dx + dy * dy <= r * r:
                out = np.maximum(out, padded[:, r + dy:r + dy + height, r + dx:r + dx + width])
    return out


def _box_reference(m: np.ndarray, b: int, axis: int) -> np.ndarray:
    n = m.shape[axis]
    out = np.zeros_like(m)
    for d in range(-b, b + 1):
        out += np.take(m, np.clip(np.arange(n) + d, 0, n - 1), axis=axis)  # edges replicated
    return out / (2 * b + 1)


def _reference(m: torch.Tensor, grow: int, feather: int, invert: bool) -> torch.Tensor:
    x = m.double().numpy()
    if grow > 0:
        x = _dilate_reference(x, grow)
    elif grow < 0:
        x = 1.0 - _dilate_reference(1.0 - x, -grow)
    if feather > 0:
        b = math.ceil(feather / 3)
        for _ in range(3):
            x = _box_reference(_box_reference(x, b, 2), b, 1)
    if invert:
        x = 1.0 - x
    return torch.from_numpy(np.clip(x, 0, 1))


def _random_masks(kind: str, shape=(3, 29, 37), seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(shape, generator=g)
    if kind == "binary":
        return (m > 0.93).float()
    if kind == "blobs":  # large regions, so erosion has something to erode
        return (torch.nn.functional.avg_pool2d(m[:, None], 7, 1, 3)[:, 0] > 0.5).float()
    return m  # soft: every value distinct


@pytest.mark.parametrize("kind", ["binary", "blobs", "soft"])
@pytest.mark.parametrize("grow", [1, 2, 3, 5, 9, 17, 40, -1, -2, -4, -9, -40])
def test_grow_equals_the_definition_exactly(kind, grow):
    m = _random_masks(kind, seed=abs(grow))
    assert torch.equal(grow_feather_invert(m, grow), _reference(m, grow, 0, False).float())


@pytest.mark.parametrize("shape", [(2, 1, 9), (2, 9, 1), (1, 1, 1), (2, 5, 64)])
def test_grow_on_degenerate_sizes(shape):
    m = _random_masks("soft", shape)
    for grow in (1, 3, 100, -3, -100):
        assert torch.equal(grow_feather_invert(m, grow), _reference(m, grow, 0, False).float()), (shape, grow)


@pytest.mark.parametrize("kind", ["binary", "soft"])
@pytest.mark.parametrize("grow,feather,invert", [(0, 1, False), (0, 3, False), (0, 8, True), (0, 40, False),
                                                 (0, 256, False), (4, 6, False), (-3, 5, True), (12, 2, False)])
def test_feather_and_grow_with_feather_equal_the_definition(kind, grow, feather, invert):
    m = _random_masks(kind, seed=feather)
    got = grow_feather_invert(m, grow, feather, invert)
    assert got.dtype == torch.float32 and got.shape == m.shape
    assert torch.allclose(got.double(), _reference(m, grow, feather, invert), rtol=0, atol=2e-6)


def test_chunks_give_the_same_result(monkeypatch):
    m = _random_masks("blobs", (7, 20, 24))
    whole = grow_feather_invert(m, -5, 4)
    monkeypatch.setitem(mask_raster._CHUNK_ELEMENTS, "cpu", 2 * 20 * 24)  # two frames per chunk
    assert torch.equal(grow_feather_invert(m, -5, 4), whole)


def test_large_grow_is_fast():
    # The cases: 130 frames 192x96 at grow 256 took 100 s; 8 frames 1344x768 at grow 32 took 6 s.
    g = torch.Generator().manual_seed(1)
    cases = [((130, 96, 192), 256, 0), ((8, 768, 1344), 32, 0), ((8, 768, 1344), -32, 0), ((4, 768, 1344), 0, 256)]
    for shape, grow, feather in cases:
        m = (torch.rand(shape, generator=g) > 0.9995).float()
        started = time.monotonic()
        out = grow_feather_invert(m, grow, feather)
        elapsed = time.monotonic() - started
        assert out.shape == m.shape
        assert elapsed < 8, f"{shape} grow {grow} feather {feather}: {elapsed:.1f} s"


def test_soft_large_grow_is_fast():
    m = torch.rand((4, 384, 672), generator=torch.Generator().manual_seed(2))
    started = time.monotonic()
    grow_feather_invert(m, 64)
    assert time.monotonic() - started < 8


def test_check_stops_between_chunks(monkeypatch):
    monkeypatch.setitem(mask_raster._CHUNK_ELEMENTS, "cpu", 96 * 192)  # one frame per chunk
    m = (torch.rand(130, 96, 192, generator=torch.Generator().manual_seed(3)) > 0.999).float()
    calls = []

    def check():
        calls.append(1)
        if len(calls) == 50:
            raise services.H3Interrupted("stop")

    with pytest.raises(services.H3Interrupted):
        grow_feather_invert(m, 256, check=check)
    assert len(calls) == 50
    # a single big frame: checked between chords too
    calls.clear()
    with pytest.raises(services.H3Interrupted):
        grow_feather_invert(torch.ones(1, 200, 200), 150, check=check)
    assert len(calls) == 50


@pytest.mark.parametrize("stop_at", [3, 40])  # while rasterising (a check every 16 frames), mid grow
def test_mask_draw_honours_stop(monkeypatch, stop_at):
    monkeypatch.setitem(mask_raster._CHUNK_ELEMENTS, "cpu", 48 * 64)  # one frame per chunk
    services.clear_interrupt()
    real = services.raise_if_interrupted
    calls = []

    def stop_after_a_few():
        calls.append(1)
        if len(calls) == stop_at:
            services.request_interrupt()  # what POST /interrupt does
        real()

    monkeypatch.setattr(services, "raise_if_interrupted", stop_after_a_few)
    state = '{"width": 64, "height": 48, "keyframes": [{"frame": 0, "shapes": [{"type": "rect", "x": 4, "y": 4, ' \
            '"w": 8, "h": 8}]}]}'
    video = H3Video(torch.zeros(200, 48, 64, 3, dtype=torch.uint8), 24)
    with pytest.raises(services.H3Interrupted):
        H3MaskDraw().draw(video, state, grow=40, feather=9)
    assert len(calls) == stop_at
    services.clear_interrupt()
    (mask,) = H3MaskDraw().draw(H3Video(torch.zeros(3, 48, 64, 3, dtype=torch.uint8), 24), state, grow=3)
    assert mask.shape == (3, 48, 64) and mask.device.type == "cpu" and mask[0, 8, 8] == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the GPU path is not run (CPU covers it)")
def test_cuda_equals_cpu():
    for kind in ("binary", "soft"):
        m = _random_masks(kind, (5, 60, 90))
        for grow, feather in ((7, 0), (-6, 0), (0, 11), (25, 4)):
            cpu = grow_feather_invert(m, grow, feather)
            on_gpu = grow_feather_invert(m.cuda(), grow, feather)
            assert on_gpu.device.type == "cuda"
            assert torch.allclose(on_gpu.cpu(), cpu, rtol=0, atol=1e-6)
            auto = grow_feather_invert(m, grow, feather, device="auto")
            assert auto.device.type == "cpu" and torch.allclose(auto, cpu, rtol=0, atol=1e-6)


def test_a_busy_gpu_hands_the_work_back(monkeypatch):
    """Out of memory on the device the masks were moved to: the rest is done where they live, same result."""
    m = _random_masks("blobs", (6, 20, 24))
    want = grow_feather_invert(m, 4, 3)
    real = mask_raster._grow_chunk

    def grow_chunk(x, grow, check):
        if x.device.type == "meta":
            raise torch.cuda.OutOfMemoryError("busy")
        return real(x, grow, check)

    monkeypatch.setattr(mask_raster, "_grow_chunk", grow_chunk)
    assert torch.equal(grow_feather_invert(m, 4, 3, device="meta"), want)


def test_mask_draw_computes_on_comfyuis_device(monkeypatch):
    import sys
    import types

    from comfyui_h3.nodes import mask_draw

    fake = types.ModuleType("comfy.model_management")
    fake.get_torch_device = lambda: torch.device("cpu")
    monkeypatch.setitem(sys.modules, "comfy.model_management", fake)
    monkeypatch.delenv("COMFYUI_H3_COMFY", raising=False)
    assert services.comfy_compute_device() == torch.device("cpu")
    seen = []

    def spy(masks, grow, feather, invert, *, check=None, device=None):
        seen.append(device)
        return masks

    monkeypatch.setattr(mask_draw, "grow_feather_invert", spy)
    H3MaskDraw().draw(H3Video(torch.zeros(2, 8, 8, 3, dtype=torch.uint8), 24), "", grow=1)
    monkeypatch.delitem(sys.modules, "comfy.model_management")
    assert services.comfy_compute_device() is None
    H3MaskDraw().draw(H3Video(torch.zeros(2, 8, 8, 3, dtype=torch.uint8), 24), "", grow=1)
    assert seen == [torch.device("cpu"), "auto"]
