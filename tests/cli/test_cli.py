"""The command line as users run it: generate (equal to the diffusers reference for the same seed), run a shipped
workflow, the demo, and clear errors for bad input that leave nothing behind."""

import json
import os

import pytest
import torch

from cli_helpers import REPO, cli, streams  # noqa: F401 - REPO for the tests below


@pytest.mark.slow
def test_generate_matches_reference_seed_and_writes_mp4(tmp_path, tiny_h3_dir):
    from safetensors.torch import load_file

    out = cli("generate", "--model", tiny_h3_dir, "--prompt", "rain on a tin roof", "--frames", 124, "--width", 64,
              "--height", 96, "--steps", 3, "--seed", 1234, "--device", "cpu", "--out", tmp_path / "clip.mp4",
              "--save-latents",
              tmp_path / "lat.safetensors", cwd=tmp_path, cache=tiny_h3_dir.parent)
    assert out.returncode == 0, out.stderr
    latents = load_file(tmp_path / "lat.safetensors")
    assert tuple(latents["video"].shape) == (1, 24, 37, 6, 4) and tuple(latents["audio"].shape) == (2, 32, 207)
    assert streams(tmp_path / "clip.mp4") == (124, 24.0, 32000, 2)

    import diffusers

    ref = diffusers.ModularPipeline.from_pretrained(str(tiny_h3_dir))
    ref.load_components(torch_dtype=torch.float32)
    want = ref(prompt="rain on a tin roof", num_frames=124, height=96, width=64, num_inference_steps=4,
               generator=torch.Generator("cpu").manual_seed(1234), output=["latents", "audio_latents"])
    for key, ref_key in (("video", "latents"), ("audio", "audio_latents")):
        err = (latents[key].double() - want[ref_key].double()).norm() / want[ref_key].double().norm()
        assert err <= 1e-4, (key, float(err))


@pytest.mark.slow
@pytest.mark.parametrize("args,message", [
    (["--model", "/no/such/folder", "--prompt", "x"], "not found"),
    (["--prompt", "x", "--seconds", "20"], "5 to 15 s"),
    (["--prompt", "x", "--width", "1000", "--height", "768"], "multiples of 32"),
    (["--prompt", "x", "--width", "2048", "--height", "256"], "aspect ratios"),
    (["--prompt", ""], "prompt is empty"),
    (["--prompt", "x", "--first-frame", "{bad}"], "Cannot read image"),
    (["--prompt", "x"] + ["--reference", "{img}"] * 10, "at most 9 image references"),
    (["--prompt", "x", "--first-frame", "{img}", "--reference", "{img}"], "not both"),
])
def test_bad_input_is_a_clear_error_and_writes_nothing(tmp_path, tiny_h3_dir, args, message):
    from PIL import Image

    (tmp_path / "bad.png").write_bytes(b"this is not an image")
    Image.new("RGB", (64, 64), (10, 20, 30)).save(tmp_path / "img.png")
    args = [a.format(bad=tmp_path / "bad.png", img=tmp_path / "img.png") for a in args]
    if "--model" not in args:
        args = ["--model", str(tiny_h3_dir)] + args
    out = cli("generate", *args, "--out", tmp_path / "o.mp4", cwd=tmp_path, cache=tiny_h3_dir.parent)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert not (tmp_path / "o.mp4").exists() and not (tmp_path / "output").exists()


@pytest.mark.slow
def test_never_overwrites_an_existing_output(tmp_path, tiny_h3_dir):
    (tmp_path / "o.mp4").write_bytes(b"user data")
    out = cli("generate", "--model", tiny_h3_dir, "--prompt", "x", "--out", tmp_path / "o.mp4", cwd=tmp_path,
              cache=tiny_h3_dir.parent)
    assert out.returncode == 2 and "exists" in out.stderr
    assert (tmp_path / "o.mp4").read_bytes() == b"user data"


@pytest.mark.slow
def test_run_shipped_workflow_with_overrides(tmp_path, tiny_h3_dir):
    wf = os.path.join(REPO, "example_workflows", "api", "h3_text_to_video.api.json")
    out = cli("run", wf, "--set", "2.steps=2", "--set", "2.seconds=6", "--set", "1.dtype=\"float32\"",
              "--out-dir", tmp_path / "out", cwd=tmp_path, cache=tiny_h3_dir.parent)
    assert out.returncode == 0, out.stderr
    (path,) = out.stdout.split()
    assert path.endswith(".mp4") and streams(path) == (158, 24.0, 32000, 2)  # 6 s = 144 frames, snapped up to 17n+5
    bad = cli("run", wf, "--set", "9.steps=2", cwd=tmp_path, cache=tiny_h3_dir.parent)
    assert bad.returncode == 2 and "no node '9'" in bad.stderr


@pytest.mark.slow
@pytest.mark.parametrize("sets,message", [
    (["3.preset=bogus"], "preset: 'bogus' is not one of"),
    (["3.crf=99"], "crf: 99 is bigger than the maximum 51"),
    (["2.stepz=20"], "node 2 (H3_Sample) has no input 'stepz'"),
    (["2.steps=abc"], "steps: 'abc' is not an INT value"),
])
def test_run_refuses_what_comfyui_refuses_before_running(tmp_path, tiny_h3_dir, sets, message):
    from comfyui_h3.templates import workflows_dir

    wf = workflows_dir() / "h3_text_to_video.api.json"
    args = [item for s in sets for item in ("--set", s)]
    out = cli("run", wf, *args, "--out-dir", tmp_path / "out", cwd=tmp_path, cache=tiny_h3_dir.parent, timeout=120)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1  # and no node ran: no "[1] ..." line
    assert not (tmp_path / "out").exists() or not any(files for _, _, files in os.walk(tmp_path / "out"))


@pytest.mark.slow
def test_demo_runs_the_shipped_workflows(tmp_path, tiny_h3_dir):
    # 18 workflows, four of them with SeedVR2 on the CPU: ~3 min on a 2-core AVX-512 machine, but CI once took
    # over 10 on a loaded one (bf16 convolutions without native bf16); the bound is for a hang, not for speed.
    out = cli("demo", "--steps", 2, "--out-dir", tmp_path / "demo", cwd=tmp_path, cache=tiny_h3_dir.parent,
              timeout=2400)
    assert out.returncode == 0, out.stderr
    paths = [p for p in out.stdout.split() if p.endswith(".mp4")]
    # t2va, first/last frame, removal, replacement, the four Track Mask removals / replacements, inpainting (5 s
    # each); extension (5 s source + 20 s, two windows) and generate-then-extend (5 s + 10 s, one window); SeedVR2
    # x2: the 130-frame sample, a 5-s clip, and the sample extended by 5 s (8 chunks of 17 frames); the restyle of the
    # sample (cut down to 124 frames), a refined clip, one clip through both routes (H3 Refine, SeedVR2 x1.43), and
    # the storyboard's film (a 5-s cut, 5 s continued in 8 chunks, a 5-s cut)
    assert len(paths) == 19
    frames = [124] * 9 + [124 + 493, 124 + 255] + [130, 124, 124 + 136] + [124] * 4 + [124 + 136 + 124]
    for path, count in zip(paths, frames):
        assert streams(path) == (count, 24.0, 32000, 2), path


def test_shipped_ui_workflows_match_their_api_twins():
    from comfyui_h3.registration import NODE_CLASS_MAPPINGS
    from comfyui_h3.workflow_format import ui_to_api

    templates = os.path.join(REPO, "example_workflows")  # UI format; their API twins in api/
    names = sorted(f[:-9] for f in os.listdir(os.path.join(templates, "api")) if f.endswith(".api.json"))
    assert names == sorted(f[:-5] for f in os.listdir(templates) if f.endswith(".json"))
    from comfyui_h3.native_workflows import NATIVE_WORKFLOWS

    for name in names:
        if name in NATIVE_WORKFLOWS:  # with ComfyUI's own nodes: tests/lane/test_native_workflows.py checks them
            continue
        with open(os.path.join(templates, "api", f"{name}.api.json")) as handle:
            api = json.load(handle)
        with open(os.path.join(templates, f"{name}.json")) as handle:
            ui = json.load(handle)
        assert ui_to_api(ui, NODE_CLASS_MAPPINGS) == api, name
