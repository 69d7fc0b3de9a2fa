"""NaN / infinity in any input tensor (mask, frames, waveforms, latents, IMAGE) is refused where the request is made,
naming the input, before a worker starts (it used to give a black, silent clip with NaN latents). CLI and node paths."""

import numpy as np
import pytest
import torch

from comfyui_h3.backend.finite import check_finite, count_non_finite
from comfyui_h3.backend.pipelines.h3.geometry import RequestError
from comfyui_h3.backend.pipelines.h3.request import H3ExtendRequest, H3Request, ReferenceInput

BAD = [float("nan"), float("inf"), float("-inf")]


def _clip(frames=124):
    return np.zeros((frames, 64, 96, 3), np.uint8)


def _poison(value, bad, index=-1):
    value = value.clone() if isinstance(value, torch.Tensor) else value.copy()
    value.reshape(-1)[index] = bad
    return value


def test_count_and_check():
    x = torch.rand(40, 8, 8)
    assert count_non_finite(x) == 0 and count_non_finite(np.zeros((3, 3), np.uint8)) == 0
    x[3, 0, 0], x[39, 7, 7] = float("nan"), float("inf")  # in different slices
    assert count_non_finite(x) == 2 and count_non_finite(x.numpy()) == 2 and count_non_finite(x.double()) == 2
    assert count_non_finite(float("nan")) == 1 and count_non_finite(None) == 0 and count_non_finite(3) == 0
    with pytest.raises(RequestError, match=r"The mask holds 2 NaN or infinite value\(s\) of 2560"):
        check_finite(x, "mask")
    with pytest.raises(RequestError, match="frame rate must be a finite number"):
        check_finite(float("nan"), "frame rate")


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("field", ["mask", "source_audio", "source_frames"])
def test_edit_request_refuses_non_finite_inputs(field, bad):
    fields = {"mask": np.ones((124, 64, 96), np.float32), "source_audio": torch.zeros(2, 32000 * 5),
              "source_frames": _clip().astype(np.float32)}
    fields[field] = _poison(fields[field], bad)
    request = H3Request(prompt="x", source_sample_rate=32000, **fields)
    what = {"mask": "mask", "source_audio": "source audio", "source_frames": "source video"}[field]
    with pytest.raises(RequestError, match=f"The {what} holds 1 NaN"):
        request.validate()


@pytest.mark.parametrize("kind,field", [("video", "frames"), ("video", "audio"), ("audio", "audio")])
def test_reference_inputs_are_checked(kind, field):
    ref = ReferenceInput(kind, frames=_clip(24).astype(np.float32) if kind == "video" else None,
                         audio=torch.zeros(2, 3200), sample_rate=32000)
    setattr(ref, field, _poison(getattr(ref, field), float("nan")))
    image = ReferenceInput("image", image=__import__("PIL.Image").Image.new("RGB", (64, 64)))
    with pytest.raises(RequestError, match=f"reference 2 \\({kind}\\) {field}"):
        H3Request(prompt="x", references=[image, ref]).validate()


@pytest.mark.parametrize("field", ["source_video_latents", "source_audio_latents", "driving_audio"])
def test_extend_request_refuses_non_finite_inputs(field):
    fields = {"source_video_latents": torch.zeros(1, 24, 7, 4, 6), "source_audio_latents": torch.zeros(2, 32, 80),
              "driving_audio": torch.zeros(2, 32000 * 10)}
    fields[field] = _poison(fields[field], float("inf"))
    request = H3ExtendRequest(prompts=["x"], added_frames=17, window_frames=56, overlap_frames=22, audio_mode="lock",
                              driving_sample_rate=32000, **fields)
    with pytest.raises(RequestError, match=field.replace("_", " ")):
        request.validate()


def test_nodes_refuse_non_finite_inputs_before_any_worker(tiny_h3_dir):
    from comfyui_h3.backend.pipelines.h3.family import h3_config
    from comfyui_h3.nodes.edit import H3Edit
    from comfyui_h3.nodes.sample import H3Sample
    from comfyui_h3.types import H3EngineHandle
    from comfyui_h3.video_types import H3Video, as_h3_video

    handle = H3EngineHandle(h3_config(model_dir=str(tiny_h3_dir), device="cpu", dtype="float32"))
    video = H3Video(torch.from_numpy(_clip()), 24, torch.zeros(2, 165334), 32000)
    mask = torch.ones(124, 64, 96)
    mask[5, 5, 5] = float("nan")
    with pytest.raises(ValueError, match="The mask holds 1 NaN"):
        H3Edit().edit(handle, video, mask, "removal", "x", 1, 0)
    image = torch.rand(1, 64, 96, 3)
    image[0, 1, 2, 0] = float("inf")
    with pytest.raises(ValueError, match="first_frame holds 1 NaN"):
        H3Sample().sample(handle, "x", 5.0, 0, 0, 1, 12.0, 3.0, 0, first_frame=image)
    with pytest.raises(ValueError, match="reference_images holds 1 NaN"):
        H3Sample().sample(handle, "x", 5.0, 0, 0, 1, 12.0, 3.0, 0, reference_images=image)
    assert not handle.engine().started  # refused on the driver: no worker was spawned

    class FloatVideo:  # a core VIDEO whose frames are a float IMAGE
        def get_components(self):
            from types import SimpleNamespace

            return SimpleNamespace(images=image, audio=None, frame_rate=24)

    with pytest.raises(ValueError, match="video's frames holds 1 NaN"):
        as_h3_video(FloatVideo())


def test_cli_edit_refuses_a_nan_mask_naming_the_file(tmp_path, tiny_h3_dir, capsys):
    from comfyui_h3.backend.media.save import write_mp4
    from comfyui_h3.cli import main

    video = write_mp4(str(tmp_path / "in.mp4"), torch.from_numpy(_clip()), 24)
    mask = np.ones((124, 64, 96), np.float32)
    mask[7, 1, 1] = np.nan
    np.savez(tmp_path / "m.npz", mask=mask)
    rc = main(["edit", "--model", str(tiny_h3_dir), "--video", video, "--mask", str(tmp_path / "m.npz"),
               "--prompt", "x", "--out", str(tmp_path / "out.mp4")])
    err = capsys.readouterr().err
    assert rc == 2 and "m.npz holds 1 NaN" in err and err.count("\n") == 1
    assert not (tmp_path / "out.mp4").exists()


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("node", ["track", "draw"])
def test_mask_nodes_refuse_a_non_finite_mask_naming_it(node, bad, tmp_path, monkeypatch):
    """H3 Track Mask used to return an all-NaN mask for a NaN input and clamp an infinite one (H3 Mask Draw the
    same): both refuse it, naming the input, before any model runs."""
    from comfyui_h3 import comfy_services as services
    from comfyui_h3.nodes.mask_draw import H3MaskDraw
    from comfyui_h3.nodes.track_mask import H3TrackMask
    from comfyui_h3.video_types import H3Video

    monkeypatch.setenv("COMFYUI_H3_CACHE", str(tmp_path))
    monkeypatch.setattr(services, "resolve_track_model", lambda name: pytest.fail("no model may load"))
    video = H3Video(torch.zeros(4, 16, 24, 3, dtype=torch.uint8), 24)
    mask = _poison(torch.zeros(4, 16, 24), bad, index=5)
    points = '{"version": 1, "objects": [{"id": 1, "points": [{"frame": 0, "x": 3, "y": 3}]}]}'
    with pytest.raises(ValueError, match=r"^H3 (Track Mask|Mask Draw): The mask holds 1 NaN or infinite value\(s\)"):
        if node == "track":
            H3TrackMask().track(video, "not-a-listed-model", points, "", 0, 0, False, mask=mask)
        else:
            H3MaskDraw().draw(video, "", 0, 0, False, mask=mask)
