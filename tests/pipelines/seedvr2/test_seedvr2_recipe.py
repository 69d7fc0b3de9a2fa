"""SeedVR2 recipe pieces around the model: target size, preprocess, uint8 output, colour fix (CPU, no model).

References are written here independently: torchvision's resize / center_crop (what the official code calls), and
float64 formulas with explicit loops / index arithmetic for the colour fixes."""

import math

import pytest
import torch

from comfyui_h3.backend.errors import RequestError
from comfyui_h3.backend.pipelines.seedvr2 import colorfix as C
from comfyui_h3.backend.pipelines.seedvr2 import preprocess as P

TVF = pytest.importorskip("torchvision.transforms.functional", reason="torchvision (test extra) is the resize oracle")


def _frames(n, h, w, seed=0):
    return torch.randint(0, 256, (n, h, w, 3), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


# ---- target size and geometry ----

@pytest.mark.parametrize("hw,kwargs,expected", [
    ((37, 50), dict(scale=2), (74, 100)),
    ((37, 50), dict(scale=1.5), (56, 75)),        # 55.5 -> 56 (Python round, half to even)
    ((33, 50), dict(scale=0.5), (16, 25)),       # 16.5 -> 16
    ((768, 1344), dict(scale=2), (1536, 2688)),
    ((768, 1344), dict(short_side=1080), (1080, 1890)),
    ((1344, 768), dict(short_side=1080), (1890, 1080)),  # portrait: the short side is the width
    ((100, 100), dict(short_side=48), (48, 48)),
    ((100, 150), dict(size=(64, 40)), (40, 64)),     # size is (width, height)
    ((100, 150), dict(size=(64.0, 40)), (40, 64)),
])
def test_target_size(hw, kwargs, expected):
    assert P.target_size(*hw, **kwargs) == expected


@pytest.mark.parametrize("kwargs,match", [
    (dict(), "exactly one"),
    (dict(scale=2, short_side=64), "exactly one"),
    (dict(scale=0), "positive"),
    (dict(scale=-1), "positive"),
    (dict(scale=float("nan")), "positive"),
    (dict(scale=float("inf")), "positive"),
    (dict(scale="x"), "number"),
    (dict(scale=0.1), "16..8192"),             # 10 x 15 is too small
    (dict(scale=100), "16..8192"),             # too large
    (dict(short_side=64.5), "whole"),
    (dict(short_side=True), "whole"),
    (dict(short_side=8), "16..8192"),
    (dict(size=(64,)), "width, height"),
    (dict(size=(64, 0)), "positive"),
    (dict(size=(9000, 64)), "16..8192"),
])
def test_bad_targets_are_one_line_request_errors(kwargs, match):
    with pytest.raises(RequestError, match=match) as err:
        P.target_size(100, 150, **kwargs)
    assert "\n" not in str(err.value)


def test_bad_fit_and_bad_frame_counts_are_request_errors():
    with pytest.raises(RequestError, match="fit"):
        P.plan_geometry(32, 32, scale=1, fit="stretch")
    with pytest.raises(RequestError, match="frames"):
        P.padded_frame_count(0)
    g = P.plan_geometry(8, 9, scale=2)
    with pytest.raises(RequestError, match="frames \\[frames, height, width, 3\\]"):
        P.prepare_video(torch.zeros(2, 8, 9), g)
    with pytest.raises(RequestError, match="uint8 or floating"):
        P.prepare_video(torch.zeros(2, 8, 9, 3, dtype=torch.int32), g)


@pytest.mark.parametrize("frames,expected", [(1, 1), (2, 5), (4, 5), (5, 5), (6, 9), (9, 9), (240, 241), (241, 241)])
def test_padded_frame_count(frames, expected):
    assert P.padded_frame_count(frames) == expected


@pytest.mark.parametrize("hw,scale", [((37, 50), 2), ((20, 30), 1), ((16, 16), 1), ((31, 47), 1.37)])
def test_geometry(hw, scale):
    pad = P.plan_geometry(*hw, scale=scale)
    crop = P.plan_geometry(*hw, scale=scale, fit="crop")
    rh, rw = P.target_size(*hw, scale=scale)
    for g in (pad, crop):
        assert g.source == hw and g.resized == (rh, rw)
        assert g.model[0] % 16 == 0 and g.model[1] % 16 == 0
    assert pad.model == (math.ceil(rh / 16) * 16, math.ceil(rw / 16) * 16) and pad.output == (rh, rw)
    assert crop.model == (rh // 16 * 16, rw // 16 * 16) and crop.output == crop.model
    top, left, h, w = pad.box
    assert (h, w) == (rh, rw) and top + h <= pad.model[0] and left + w <= pad.model[1]


# ---- preprocess against the official transform (torchvision) ----

def _official(frames_u8, geometry):
    """Official chain on uint8 frames: /255, TVF.resize bicubic antialias, clamp, fit, Normalize(0.5, 0.5), TCHW ->
    CTHW, last frame repeated to 4n+1. The pad fit (ours) is written with explicit replicate indices."""
    x = frames_u8.permute(0, 3, 1, 2).float() / 255.0
    x = TVF.resize(x, list(geometry.resized), interpolation=TVF.InterpolationMode.BICUBIC, antialias=True)
    x = x.clamp(0.0, 1.0)
    if geometry.fit == "crop":
        x = TVF.center_crop(x, list(geometry.model))
    else:
        (mh, mw), (rh, rw), (top, left) = geometry.model, geometry.resized, geometry.offset
        rows = (torch.arange(mh) - top).clamp(0, rh - 1)
        cols = (torch.arange(mw) - left).clamp(0, rw - 1)
        x = x[:, :, rows][:, :, :, cols]
    x = ((x - 0.5) / 0.5).permute(1, 0, 2, 3)
    n = x.shape[1]
    if n > 1 and (n - 1) % 4:
        x = torch.cat([x] + [x[:, -1:]] * (4 - (n - 1) % 4), dim=1)
    return x


@pytest.mark.parametrize("fit", ["pad", "crop"])
@pytest.mark.parametrize("n,hw,kwargs", [
    (3, (37, 50), dict(scale=2)),          # upscale, 3 -> 5 frames
    (1, (40, 35), dict(scale=0.6)),        # downscale (antialias matters), one frame stays one
    (6, (24, 40), dict(size=(57, 33))),    # 6 -> 9 frames
    (5, (32, 48), dict(scale=1)),          # no resize
])
def test_prepare_video_equals_the_official_transform(fit, n, hw, kwargs):
    frames = _frames(n, *hw)
    g = P.plan_geometry(*hw, fit=fit, **kwargs)
    ours = P.prepare_video(frames, g)
    ref = _official(frames, g)
    assert ours.shape == (3, P.padded_frame_count(n)) + g.model and ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, rtol=0, atol=2e-6)
    # float input (ComfyUI IMAGE) reads the same; chunking changes nothing; frames slices need no padding
    torch.testing.assert_close(P.prepare_video(frames.float() / 255.0, g), ours, rtol=0, atol=1e-6)
    assert torch.equal(P.prepare_video(frames, g, chunk_frames=1), ours)
    assert torch.equal(P.prepare_frames(frames, g, chunk_bytes=1), ours[:, :n])
    assert P.prepare_video(frames, g, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_prepare_reads_float_input_clamped_and_nan_as_zero():
    x = torch.full((1, 16, 16, 3), 0.5)
    x[0, 0, 0] = float("nan")
    x[0, 0, 1] = 2.0
    x[0, 0, 2] = -1.0
    out = P.prepare_video(x, P.plan_geometry(16, 16, scale=1))
    assert out[:, 0, 0, :3].tolist() == [[-1.0, 1.0, -1.0]] * 3


# ---- output frames ----

def _uint8_reference(video, geometry, frames):
    top, left, h, w = geometry.box
    v = video[:, :frames, top:top + h, left:left + w].double()
    out = torch.empty((frames, h, w, 3), dtype=torch.uint8)
    for f in range(frames):
        for c in range(3):
            plane = torch.nan_to_num(v[c, f], nan=-1.0)
            out[f, :, :, c] = ((plane.clamp(-1, 1) + 1) / 2 * 255).round().to(torch.uint8)
    return out


@pytest.mark.parametrize("fit", ["pad", "crop"])
def test_uint8_frames_crops_back_cuts_and_rounds(fit):
    g = P.plan_geometry(20, 30, scale=1.3, fit=fit)
    video = torch.randn((3, 9) + g.model, generator=torch.Generator().manual_seed(1)) * 0.7
    video[0, 0, 5, 5] = float("nan")
    out = P.uint8_frames(video, g, 7)
    assert out.shape == (7,) + g.output + (3,) and out.dtype == torch.uint8
    assert torch.equal(out, _uint8_reference(video, g, 7))
    assert torch.equal(P.uint8_frames(video[None], g, 7, chunk_frames=2), out)  # [1, 3, F, H, W] too
    assert torch.equal(torch.cat(list(P.iter_uint8_frames(video, g, 7, chunk_frames=3))), out)
    with pytest.raises(ValueError, match="cannot cut"):
        P.uint8_frames(video, g, 10)


@pytest.mark.parametrize("n", [1, 3, 6])
def test_no_resize_round_trip_is_lossless(n):
    frames = _frames(n, 20, 30, seed=4)
    g = P.plan_geometry(20, 30, scale=1)  # padded 20x30 -> 32x32 by edge replication, cropped back after
    assert torch.equal(P.uint8_frames(P.prepare_video(frames, g), g, n), frames)


# ---- colour fix: references ----

def _low_reference(v):
    """5 dilated 3x3 [[1,2,1],[2,4,2],[1,2,1]]/16 blurs (r = 1, 2, 4, 8, 16), replicate edges, float64, written as a
    sum over the 9 taps with clamped indices."""
    taps = {(-1, -1): 1, (-1, 0): 2, (-1, 1): 1, (0, -1): 2, (0, 0): 4, (0, 1): 2, (1, -1): 1, (1, 0): 2, (1, 1): 1}
    v = v.double()
    h, w = v.shape[-2:]
    for r in (1, 2, 4, 8, 16):
        acc = torch.zeros_like(v)
        for (dy, dx), k in taps.items():
            rows = [min(max(y + dy * r, 0), h - 1) for y in range(h)]
            cols = [min(max(x + dx * r, 0), w - 1) for x in range(w)]
            acc += k / 16.0 * v[..., rows, :][..., :, cols]
        v = acc
    return v


def _adain_reference(x, ref):
    x, ref = x.double(), ref.double()
    out = torch.empty_like(x)
    for c in range(x.shape[0]):
        for f in range(x.shape[1]):
            a, b = x[c, f].flatten().tolist(), ref[c, f].flatten().tolist()
            n = len(a)
            ma, mb = sum(a) / n, sum(b) / n
            sa = math.sqrt(sum((v - ma) ** 2 for v in a) / (n - 1) + 1e-5)
            sb = math.sqrt(sum((v - mb) ** 2 for v in b) / (n - 1) + 1e-5)
            out[c, f] = (x[c, f] - ma) / sa * sb + mb
    return out


def _srgb_to_lab_pixel(r, g, b):
    """One sRGB pixel (0..1) -> CIELAB, D65 white = the sRGB matrix applied to (1, 1, 1)."""
    lin = [v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in (r, g, b)]
    m = [[0.4124564, 0.3575761, 0.1804375], [0.2126729, 0.7151522, 0.0721750], [0.0193339, 0.1191920, 0.9503041]]
    xyz = [sum(m[i][j] * lin[j] for j in range(3)) / sum(m[i]) for i in range(3)]
    f = [t ** (1 / 3) if t > (6 / 29) ** 3 else t / (3 * (6 / 29) ** 2) + 4 / 29 for t in xyz]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def _video(frames=3, h=19, w=23, seed=0, spread=0.6):
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand((3, frames, h, w), generator=gen, dtype=torch.float64) * 2 - 1) * spread


# ---- colour fix: tests ----

@pytest.mark.parametrize("hw", [(19, 23), (5, 40), (2, 3)])  # radii beyond the frame (replicate keeps working)
def test_wavelet_equals_reference(hw):
    x, ref = _video(2, *hw, seed=1), _video(2, *hw, seed=2, spread=0.3) + 0.2
    expected = x - _low_reference(x) + _low_reference(ref)
    torch.testing.assert_close(C.color_fix(x, ref, "wavelet"), expected, rtol=0, atol=1e-12)
    got32 = C.color_fix(x.float(), ref.float(), "wavelet")
    assert got32.dtype == torch.float32
    torch.testing.assert_close(got32.double(), expected, rtol=0, atol=1e-5)


def test_wavelet_properties():
    x, ref = _video(seed=3), _video(seed=4)
    torch.testing.assert_close(C.color_fix(x, x, "wavelet"), x, rtol=0, atol=1e-13)  # against itself: unchanged
    const = torch.full_like(x, 0.25)
    torch.testing.assert_close(C.wavelet_low(const.permute(1, 0, 2, 3)), const.permute(1, 0, 2, 3), rtol=0,
                               atol=1e-15)
    # a colour cast (a per-channel offset between output and input) is removed exactly, detail untouched
    cast = torch.tensor([0.1, -0.05, 0.2], dtype=torch.float64).view(3, 1, 1, 1)
    torch.testing.assert_close(C.color_fix(x + cast, x, "wavelet"), x, rtol=0, atol=1e-13)
    # what changes is only low frequency: the change equals low(ref) - low(x)
    torch.testing.assert_close(C.color_fix(x, ref, "wavelet") - x, _low_reference(ref) - _low_reference(x), rtol=0,
                               atol=1e-12)


def test_adain_equals_reference_and_matches_statistics():
    x, ref = _video(2, 7, 9, seed=5), _video(2, 7, 9, seed=6, spread=0.3) - 0.1
    got = C.color_fix(x, ref, "adain")
    torch.testing.assert_close(got, _adain_reference(x, ref), rtol=0, atol=1e-12)
    torch.testing.assert_close(got.mean(dim=(2, 3)), ref.mean(dim=(2, 3)), rtol=0, atol=1e-12)
    torch.testing.assert_close(got.std(dim=(2, 3)), ref.std(dim=(2, 3)), rtol=1e-3, atol=0)


def test_lab_conversion_against_known_values_and_the_pixel_formula():
    rgb = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.2, 0.5, 0.03]],
                       dtype=torch.float64)
    lab = C.rgb_to_lab(rgb)  # [N, 3]
    torch.testing.assert_close(lab[0], torch.tensor([100.0, 0, 0], dtype=torch.float64), rtol=0, atol=1e-9)
    torch.testing.assert_close(lab[1], torch.zeros(3, dtype=torch.float64), rtol=0, atol=1e-9)
    torch.testing.assert_close(lab[2], torch.tensor([53.24, 80.09, 67.20], dtype=torch.float64), rtol=0, atol=0.02)
    torch.testing.assert_close(lab[3], torch.tensor([32.30, 79.19, -107.86], dtype=torch.float64), rtol=0, atol=0.02)
    for px, got in zip(rgb.tolist(), lab):
        torch.testing.assert_close(got, torch.tensor(_srgb_to_lab_pixel(*px), dtype=torch.float64), rtol=0,
                                   atol=1e-9)
    grid = torch.rand((4, 3, 5, 6), generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    torch.testing.assert_close(C.lab_to_rgb(C.rgb_to_lab(grid)), grid, rtol=0, atol=1e-9)


@pytest.mark.parametrize("match_luminance", [False, True])
def test_lab_fix_equals_reference_and_matches_chroma_statistics(match_luminance):
    x, ref = _video(2, 6, 7, seed=8, spread=0.5), _video(2, 6, 7, seed=9, spread=0.4) + 0.1
    got = C.color_fix(x, ref, "lab", match_luminance=match_luminance)

    def to_lab(v):  # [3, F, H, W] in [-1, 1] -> [3, F, H, W] Lab, pixel by pixel
        u = ((v + 1) / 2).clamp(0, 1)
        out = torch.empty_like(u)
        for f in range(u.shape[1]):
            for i in range(u.shape[2]):
                for j in range(u.shape[3]):
                    out[:, f, i, j] = torch.tensor(_srgb_to_lab_pixel(*u[:, f, i, j].tolist()), dtype=torch.float64)
        return out

    lx, lr = to_lab(x), to_lab(ref)
    expected = lx.clone()
    first = 0 if match_luminance else 1
    expected[first:] = _adain_reference(lx[first:], lr[first:])
    got_lab = to_lab(got)  # the fix's output stays in gamut here (checked), so reading it back is exact
    assert got.min() >= -1 and got.max() <= 1
    torch.testing.assert_close(got_lab, expected, rtol=0, atol=1e-7)
    torch.testing.assert_close(got_lab[1:].mean(dim=(2, 3)), lr[1:].mean(dim=(2, 3)), rtol=0, atol=1e-7)
    torch.testing.assert_close(got_lab[1:].std(dim=(2, 3)), lr[1:].std(dim=(2, 3)), rtol=1e-4, atol=0)
    if not match_luminance:
        torch.testing.assert_close(got_lab[0], lx[0], rtol=0, atol=1e-7)  # lightness (and its detail) kept


@pytest.mark.parametrize("method", ["wavelet", "adain", "lab"])
def test_color_fix_chunking_in_place_and_devices(method):
    x, ref = _video(5, 9, 11, seed=10).float(), _video(5, 9, 11, seed=11).float()
    whole = C.color_fix(x, ref, method)
    # per frame, so chunks change nothing but the last ulp (vectorised vs scalar pow/cbrt on tails of a chunk)
    same = lambda a, b: torch.testing.assert_close(a, b, rtol=0, atol=1e-6)  # noqa: E731
    same(C.color_fix(x, ref, method, chunk_frames=2), whole)
    same(C.color_fix(x, ref.double(), method, chunk_frames=1), whole)  # ref's dtype does not matter
    y = x.clone()
    assert C.color_fix(y, ref, method, out=y) is y
    same(y, whole)
    half = C.color_fix(x.bfloat16(), ref, method)
    assert half.dtype == torch.bfloat16


def test_color_fix_none_and_bad_arguments():
    x, ref = _video(seed=12), _video(seed=13)
    kept = C.color_fix(x, ref, "none")
    assert torch.equal(kept, x) and kept.data_ptr() != x.data_ptr()
    with pytest.raises(ValueError, match="not one of"):
        C.color_fix(x, ref, "hsv")
    with pytest.raises(ValueError, match="one shape"):
        C.color_fix(x, ref[:, :2], "wavelet")
