"""ref2va references read from files exactly as diffusers 0.42.1 reads them (`MiniMaxH3VideoReference.from_file`,
`MiniMaxH3AudioReference.from_file`): the whole soundtrack with every decoded sample (an AAC track's padded last frame
too), also where the track outlasts the video. Cutting it at its declared duration gave 80 audio condition latents
where the reference has 81, and a 1e-1 error. Checked on the reading itself and end to end (CLI and node paths) against
the reference pipeline on the tiny folder, as tests/pipelines/h3/test_pipeline_parity.py does."""

import av
import numpy as np
import pytest
import torch

diffusers = pytest.importorskip("diffusers")
from diffusers.modular_pipelines.minimax_h3 import references as ref_refs  # noqa: E402
from diffusers.modular_pipelines.minimax_h3.references import (  # noqa: E402
    MiniMaxH3AudioReference,
    MiniMaxH3VideoReference,
)

from comfyui_h3.backend.pipelines.h3.family import h3_config  # noqa: E402
from comfyui_h3.backend.media.decode import decode_reference_audio, decode_reference_video, plan_frames  # noqa: E402
from comfyui_h3.backend.pipelines.h3.request import H3Request  # noqa: E402
from comfyui_h3.cli_generate import reference_from_file  # noqa: E402
from comfyui_h3.nodes.adapters import build_references  # noqa: E402
from comfyui_h3.video_file import H3FileVideo  # noqa: E402

SEED, STEPS, FRAMES = 5, 3, 130
RATE = 32000


def _write(path, frames: int | None, fps: int, audio_seconds: float, channels: int = 2) -> None:
    """`frames` noise frames at `fps` (None: an audio-only file) and an AAC track of `audio_seconds` at 32 kHz."""
    rng = np.random.default_rng(7)
    layout = "stereo" if channels == 2 else "mono"
    with av.open(str(path), "w") as out:
        video = None
        if frames:
            video = out.add_stream("libx264", rate=fps)
            video.width, video.height, video.pix_fmt = 56, 40, "yuv420p"
        audio = out.add_stream("aac", rate=RATE)
        audio.layout = layout
        for _ in range(frames or 0):
            image = rng.integers(0, 256, (40, 56, 3), dtype=np.uint8)
            for packet in video.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                out.mux(packet)
        if video is not None:
            for packet in video.encode():
                out.mux(packet)
        samples = int(audio_seconds * RATE)
        wave = (0.1 * rng.standard_normal((channels, samples))).astype(np.float32)
        for start in range(0, samples, 1024):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(wave[:, start:start + 1024]), format="fltp",
                                               layout=layout)
            frame.sample_rate, frame.pts = RATE, start
            for packet in audio.encode(frame):
                out.mux(packet)
        for packet in audio.encode():
            out.mux(packet)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("references")
    clip, voice = folder / "clip.mp4", folder / "voice.m4a"
    _write(clip, 40, 30, 2.0)  # 1.33 s of video, 2 s of AAC: longer than the video's declared duration
    _write(voice, None, 30, 1.5, channels=1)
    return clip, voice


def test_the_track_is_longer_than_its_declared_duration(files):
    """The fixture has the hazard: the decoder gives more samples than the stream declares (AAC padding), and more
    audio than video."""
    clip, _ = files
    with av.open(str(clip)) as container:
        audio, video = container.streams.audio[0], container.streams.video[0]
        declared = float(audio.duration * audio.time_base)
        video_seconds = float(video.duration * video.time_base)
    _, _, wave, rate = ref_refs._decode_video_file(str(clip))
    assert wave.shape[1] > round(declared * rate) and declared > video_seconds + 0.5


def test_reading_equals_the_reference_reading(files):
    clip, voice = files
    frames, fps, wave, rate = ref_refs._decode_video_file(str(clip))
    ours = decode_reference_video(str(clip))
    assert torch.equal(ours.frames, torch.from_numpy(frames)) and float(ours.frame_rate) == fps
    assert ours.sample_rate == rate and torch.equal(ours.audio, wave)
    want, want_rate = ref_refs._decode_audio_file(str(voice))
    got, got_rate = decode_reference_audio(str(voice))
    assert got_rate == want_rate and torch.equal(got, want)
    # a file-backed clip (H3 Load Video's, at its default 24 fps) gives the reference the same soundtrack
    got, got_rate = H3FileVideo(str(clip), force_rate=24).reference_audio()
    assert got_rate == rate and torch.equal(got, wave)
    # ... unless its selection took a section: then that section's sound, as the clip's own audio
    section = H3FileVideo(str(clip), force_rate=24, skip_first_frames=4, frame_load_cap=20)
    got, _ = section.reference_audio()
    assert torch.equal(got, section.audio) and got.shape[1] == round(20 / 24 * RATE)
    assert plan_frames(str(clip), force_rate=24).trims_time is False


@pytest.fixture(scope="module")
def pipelines(tiny_h3_dir):
    ours = h3_config(str(tiny_h3_dir), dtype="float32").build_pipeline(0)
    ref = diffusers.ModularPipeline.from_pretrained(str(tiny_h3_dir))
    ref.load_components(torch_dtype=torch.float32)
    return ours, ref


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _our_references(path: str, how: str, voice: str):
    if how == "cli":
        return [reference_from_file(path), reference_from_file(voice)]
    audio = reference_from_file(voice)
    return build_references(None, H3FileVideo(path, force_rate=24), None) + [audio]  # H3 Load Video's default


@pytest.mark.slow
@pytest.mark.parametrize("how", ["cli", "node"])
def test_ref2va_with_a_video_file_reference_matches_diffusers(pipelines, files, how):
    ours, ref = pipelines
    clip, voice = files
    want = ref(prompt="a drum solo", num_frames=FRAMES, num_inference_steps=STEPS + 1,
               generator=torch.Generator("cpu").manual_seed(SEED), output=["latents", "audio_latents", "audio"],
               references=[MiniMaxH3VideoReference.from_file(str(clip)), MiniMaxH3AudioReference.from_file(str(voice))])
    got = ours.run(H3Request(prompt="a drum solo", num_frames=FRAMES, steps=STEPS, seed=SEED,
                             references=_our_references(str(clip), how, str(voice))))
    assert got.task == "ref2va"
    assert got.video_latents.shape == want["latents"].shape
    assert got.audio_latents.shape == want["audio_latents"].shape
    assert rel(got.video_latents, want["latents"]) <= 1e-4
    assert rel(got.audio_latents, want["audio_latents"]) <= 1e-4
    assert rel(got.audio, want["audio"][0]) <= 1e-4
