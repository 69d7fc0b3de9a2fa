"""Our T2VA / FL2VA / Ref2VA pipelines vs diffusers' MiniMaxH3ModularPipeline on the tiny folder: same seed, steps,
shifts and inputs. Final latents rel err <= 1e-4; decoded audio rel err <= 1e-4; decoded frames within 1/255."""

import numpy as np
import pytest
import torch
from PIL import Image

diffusers = pytest.importorskip("diffusers")
from diffusers.modular_pipelines.minimax_h3.references import (  # noqa: E402
    MiniMaxH3AudioReference,
    MiniMaxH3ImageReference,
    MiniMaxH3VideoReference,
)

from comfyui_h3.backend.pipelines.h3.family import h3_config  # noqa: E402
from comfyui_h3.backend.pipelines.h3.request import H3Request, ReferenceInput  # noqa: E402

SEED, STEPS, FRAMES = 11, 3, 130  # 130 snaps up to 141 (17n+5) on both sides


@pytest.fixture(scope="module")
def pipelines(tiny_h3_dir):
    ours = h3_config(str(tiny_h3_dir), dtype="float32").build_pipeline(0)
    ref = diffusers.ModularPipeline.from_pretrained(str(tiny_h3_dir))
    ref.load_components(torch_dtype=torch.float32)
    return ours, ref


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def media():
    rng = np.random.default_rng(3)
    first = Image.fromarray(rng.integers(0, 256, (48, 80, 3), dtype=np.uint8))
    last = Image.fromarray(rng.integers(0, 256, (70, 50, 3), dtype=np.uint8))
    clip = rng.integers(0, 256, (40, 40, 56, 3), dtype=np.uint8)
    sound = torch.from_numpy(rng.standard_normal((2, 32000 * 3)).astype(np.float32) * 0.1)
    voice = torch.from_numpy(rng.standard_normal((1, 32000 * 2)).astype(np.float32) * 0.1)
    return first, last, clip, sound, voice


def cases():
    first, last, clip, sound, voice = media()
    yield "t2va", dict(height=64, width=96), dict(height=64, width=96)
    yield "t2va_default_canvas", {}, {}
    yield "fl2va_first_last", dict(image=first, last_image=last), dict(first_frame=first, last_frame=last)
    yield "fl2va_last_only", dict(last_image=last), dict(last_frame=last)
    yield ("ref2va_image", dict(references=[MiniMaxH3ImageReference(image=first)], height=64, width=64),
           dict(references=[ReferenceInput("image", image=first)], height=64, width=64))
    yield ("ref2va_video_audio",
           dict(references=[MiniMaxH3VideoReference(frames=clip, fps=30.0, audio=sound, sample_rate=32000),
                            MiniMaxH3ImageReference(image=last),
                            MiniMaxH3AudioReference(audio=voice, sample_rate=32000)]),
           dict(references=[ReferenceInput("video", frames=clip, fps=30.0, audio=sound, sample_rate=32000),
                            ReferenceInput("image", image=last),
                            ReferenceInput("audio", audio=voice, sample_rate=32000)]))


@pytest.mark.slow
@pytest.mark.parametrize("name,ref_kwargs,our_kwargs", list(cases()), ids=[c[0] for c in cases()])
def test_matches_reference(pipelines, name, ref_kwargs, our_kwargs):
    ours, ref = pipelines
    want = ref(prompt="a red fox runs", num_frames=FRAMES, num_inference_steps=STEPS + 1,
               generator=torch.Generator("cpu").manual_seed(SEED), output=["latents", "audio_latents", "videos", "audio"],
               **ref_kwargs)
    got = ours.run(H3Request(prompt="a red fox runs", num_frames=FRAMES, steps=STEPS, seed=SEED, **our_kwargs))
    assert got.video_latents.shape == want["latents"].shape
    assert got.audio_latents.shape == want["audio_latents"].shape
    assert rel(got.video_latents, want["latents"]) <= 1e-4
    assert rel(got.audio_latents, want["audio_latents"]) <= 1e-4
    ref_frames = torch.from_numpy(np.stack([np.asarray(f) for f in want["videos"][0]]))
    assert got.frames.shape == ref_frames.shape
    assert (got.frames.int() - ref_frames.int()).abs().max() <= 1
    assert rel(got.audio, want["audio"][0]) <= 1e-4
    assert got.task == name.split("_")[0]


def test_text_encoder_loads_only_the_layers_h3_reads(pipelines):
    ours, _ = pipelines
    model = ours.c.text.model
    assert len(model.model.language_model.layers) == 50  # the tiny checkpoint has 52; layers 50, 51 never load
    assert isinstance(model.lm_head, torch.nn.Identity)


def test_keyframe_content_steers_the_result(pipelines):
    """The anchors reach the model: a different first frame with the same seed gives different latents."""
    ours, _ = pipelines
    first, last, *_ = media()
    a = ours.run(H3Request(prompt="x", num_frames=124, steps=2, seed=1, first_frame=first, decode=False))
    b = ours.run(H3Request(prompt="x", num_frames=124, steps=2, seed=1, first_frame=first.rotate(90), decode=False))
    assert rel(a.video_latents, b.video_latents) > 1e-3


# -- the schedule shifts come from the model folder's scheduler configs, as the reference reads them ----------------

FOLDER_SHIFTS = {"scheduler": 5.0, "audio_scheduler": 7.5}  # not the release's 12 / 3


@pytest.fixture(scope="module")
def shifted(tiny_h3_dir, tmp_path_factory):
    """A copy of the tiny folder whose scheduler configs set other shifts; ours and diffusers' pipelines on it."""
    import json
    import shutil

    folder = tmp_path_factory.mktemp("shifted") / "tiny-h3"
    shutil.copytree(tiny_h3_dir, folder)
    for name, shift in FOLDER_SHIFTS.items():
        path = folder / name / "scheduler_config.json"
        config = json.loads(path.read_text())
        config["shift"] = shift
        path.write_text(json.dumps(config))
    ours = h3_config(str(folder), dtype="float32").build_pipeline(0)
    ref = diffusers.ModularPipeline.from_pretrained(str(folder))
    ref.load_components(torch_dtype=torch.float32)
    assert (ref.scheduler.config.shift, ref.audio_scheduler.config.shift) == tuple(FOLDER_SHIFTS.values())
    return ours, ref


@pytest.mark.slow
@pytest.mark.parametrize("name,ref_kwargs,our_kwargs", [c for c in cases() if c[0] in ("t2va", "fl2va_first_last")],
                         ids=["t2va", "fl2va_first_last"])
def test_folder_shifts_match_reference(shifted, name, ref_kwargs, our_kwargs):
    """A request that sets no shift uses the folder's, as diffusers does (it was 12 / 3 whatever the folder said)."""
    ours, ref = shifted
    want = ref(prompt="a red fox runs", num_frames=FRAMES, num_inference_steps=STEPS + 1,
               generator=torch.Generator("cpu").manual_seed(SEED), output=["latents", "audio_latents"], **ref_kwargs)
    got = ours.run(H3Request(prompt="a red fox runs", num_frames=FRAMES, steps=STEPS, seed=SEED, decode=False,
                             **our_kwargs))
    assert rel(got.video_latents, want["latents"]) <= 1e-4
    assert rel(got.audio_latents, want["audio_latents"]) <= 1e-4


def test_explicit_shifts_override_the_folder(shifted, pipelines):
    """Shifts set on the request (node widget != 0, --video-shift) win over the folder's: 12 / 3 on the shifted
    folder equal the reference on the release-shift folder (same weights)."""
    ours, _ = shifted
    _, ref = pipelines
    want = ref(prompt="a red fox runs", num_frames=FRAMES, num_inference_steps=STEPS + 1, height=64, width=96,
               generator=torch.Generator("cpu").manual_seed(SEED), output=["latents", "audio_latents"])
    got = ours.run(H3Request(prompt="a red fox runs", num_frames=FRAMES, steps=STEPS, seed=SEED, decode=False,
                             height=64, width=96, video_shift=12.0, audio_shift=3.0))
    assert rel(got.video_latents, want["latents"]) <= 1e-4
    assert rel(got.audio_latents, want["audio_latents"]) <= 1e-4
    default = ours.run(H3Request(prompt="a red fox runs", num_frames=FRAMES, steps=STEPS, seed=SEED, decode=False,
                                 height=64, width=96))
    assert rel(default.video_latents, want["latents"]) > 1e-3  # the folder's shifts do make a difference


@pytest.mark.parametrize("node", ["sample", "edit", "extend"])
def test_node_shift_widgets_default_to_the_folder(monkeypatch, tmp_path, node):
    """The widgets' default 0 means "the model folder's" (None on the request); another value is passed through."""
    import importlib

    monkeypatch.setenv("COMFYUI_H3_TEMP", str(tmp_path))  # H3 Extend reserves its output file there

    from comfyui_h3.video_types import H3Video

    module = importlib.import_module(f"comfyui_h3.nodes.{node}")
    cls = {"sample": "H3Sample", "edit": "H3Edit", "extend": "H3Extend"}[node]
    node_cls = getattr(module, cls)
    spec = node_cls.INPUT_TYPES()["required"]
    assert spec["video_shift"][1]["default"] == 0.0 and spec["audio_shift"][1]["default"] == 0.0
    assert spec["video_shift"][1]["min"] == 0.0 and "model folder" in spec["video_shift"][1]["tooltip"]

    seen = []

    def capture(handle, request, *args, **kwargs):
        seen.append((request.video_shift, request.audio_shift))
        raise KeyboardInterrupt  # stop before anything else runs

    monkeypatch.setattr(module, "run_engine", capture)
    widgets = {name: value[1]["default"] for name, value in spec.items()
               if len(value) > 1 and "default" in value[1]}
    widgets["prompt"] = "waves"
    frames = torch.zeros((124, 64, 64, 3), dtype=torch.uint8)
    inputs = {"sample": {}, "edit": {"video": H3Video(frames, 24, None, None), "mask": torch.ones(124, 64, 64)},
              "extend": {"video": H3Video(frames, 24, None, None)}}[node]
    run = getattr(node_cls(), node_cls.FUNCTION)
    for shifts, want in (({}, (None, None)), ({"video_shift": 5.0, "audio_shift": 7.5}, (5.0, 7.5))):
        with pytest.raises(KeyboardInterrupt):
            run(engine=None, **{**widgets, **shifts}, **inputs)
        assert seen.pop() == want


def test_cli_shift_options_default_to_the_folder():
    from comfyui_h3.cli import _parser

    for command in (["generate", "--prompt", "x"], ["edit", "--prompt", "x", "--video", "v.mp4", "--mask", "m.png", "--out", "o.mp4"],
                    ["extend", "--prompt", "x", "--video", "v.mp4", "--seconds", "5", "--out", "o.mp4"]):
        args = _parser().parse_args(command)
        assert (args.video_shift, args.audio_shift) == (None, None)
    args = _parser().parse_args(["generate", "--prompt", "x", "--video-shift", "5", "--audio-shift", "7.5"])
    assert (args.video_shift, args.audio_shift) == (5.0, 7.5)
