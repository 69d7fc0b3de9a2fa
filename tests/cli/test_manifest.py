"""The stage manifest (backend/manifest.py): tiny H3 t2va and tiny SeedVR2 upscale carry one with their stages and
sane numbers; the engine adds its fields; 2 gloo ranks give one peak entry per rank; the CLI's --manifest writes
`<out>.manifest.json` beside the output and never overwrites; H3 Save Video writes it beside the MP4."""

from __future__ import annotations

import json

import pytest
import torch

from repo_paths import REPO_DIR
from comfyui_h3.backend import manifest as mf
from comfyui_h3.backend.engine import Engine
from comfyui_h3.backend.pipelines.h3.family import h3_config
from comfyui_h3.backend.pipelines.h3.request import H3Request

STEPS = 3


def t2va(**kw):
    base = dict(prompt="thunder over hills", num_frames=124, steps=STEPS, seed=9, width=64, height=64, decode=True)
    base.update(kw)
    return H3Request(**base)


def _check_common(m, steps):
    assert m["schema"] == mf.SCHEMA
    assert set(m) == set(mf.new_manifest())  # the schema's keys, no more, no fewer
    stages = m["stages"]
    assert stages["total_s"] > 0
    assert len(stages["denoise_steps_s"]) == steps
    assert all(s > 0 for s in stages["denoise_steps_s"])
    assert m["peak_memory"] and all(p["peak_host_rss_bytes"] > 0 for p in m["peak_memory"])
    json.loads(mf.dumps(m))  # JSON-able as it stands


@pytest.fixture(scope="module")
def h3_pipe(tiny_h3_dir):
    return h3_config(str(tiny_h3_dir), dtype="float32").build_pipeline(0)


def test_h3_t2va_manifest_has_every_stage(h3_pipe):
    result = h3_pipe.run(t2va())
    m = result.manifest
    _check_common(m, STEPS)
    s = m["stages"]
    assert s["text_encode_s"] > 0 and s["condition_encode_s"] >= 0 and s["decode_s"] > 0
    assert sum(s["denoise_steps_s"]) <= s["denoise_s"] + 1e-6  # the steps are inside the denoise stage
    assert s["total_s"] >= s["text_encode_s"] + s["denoise_s"] + s["decode_s"] - 1e-6
    assert m["request"] == {"kind": "t2va", "family": "h3", "task": "t2va", "seed": 9, "steps": STEPS,
                            "shapes": m["request"]["shapes"],
                            "schedule": {"name": "default", "video_shift": 12.0, "audio_shift": 3.0}}
    assert m["request"]["shapes"]["frames"] == list(result.frames.shape[:3])
    assert m["peak_memory"] == [m["peak_memory"][0]] and m["peak_memory"][0]["rank"] == 0
    assert m["peak_memory"][0]["peak_device_bytes"] is None  # CPU: no device counter
    assert m["adaln_cache"] is None  # direct projection
    assert "s/step" in mf.summary(m) and "GiB" not in mf.summary(m)  # no device peak on the CPU


def test_seedvr2_upscale_manifest(tmp_path):
    from comfyui_h3.backend.models.seedvr2.tiny import DIT_FILE, TEXT_FILE, VAE_FILE, make_tiny_seedvr2
    from comfyui_h3.backend.pipelines.seedvr2.family import seedvr2_config
    from comfyui_h3.backend.pipelines.seedvr2.request import UpscaleRequest

    root = make_tiny_seedvr2(tmp_path / "m", "3b")
    pipe = seedvr2_config(root / DIT_FILE.format(variant="3b"), root / VAE_FILE, root / TEXT_FILE,
                          dtype="float32", vae_dtype="float32").build_pipeline(0)
    video = torch.randint(0, 256, (13, 16, 24, 3), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    result = pipe.run(UpscaleRequest(video, scale=2.0, batch_frames=9, overlap=4, timings=True))
    m = result.manifest
    _check_common(m, 0)
    assert m["request"]["kind"] == "upscale" and m["request"]["family"] == "seedvr2"
    assert m["request"]["shapes"]["output"] == [13, 32, 48]
    assert len(m["extra_stages"]["batch_s"]) == result.batches == 2
    assert all(m["extra_stages"][k] > 0 for k in ("encode_s", "dit_s", "color_fix_s"))
    assert m["stages"]["decode_s"] > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: per-step times from CUDA events and the "
                    "device's peak counter (the CPU tests cover the host-clock path and the schema)")
def test_cuda_step_events_and_device_peak(tiny_h3_dir):
    pipe = h3_config(str(tiny_h3_dir), device="cuda", dtype="bfloat16").build_pipeline(0)
    m = pipe.run(t2va()).manifest
    steps = m["stages"]["denoise_steps_s"]
    assert len(steps) == STEPS and all(s > 0 for s in steps)
    assert sum(steps) <= m["stages"]["denoise_s"] * 1.05 + 0.01  # device time inside the host's denoise span
    peak = m["peak_memory"][0]
    assert peak["device"].startswith("cuda") and peak["peak_device_bytes"] > 0
    assert "GiB" in mf.summary(m)

def test_h3_manifest_reports_the_adaln_cache_bytes(tiny_h3_dir):
    from comfyui_h3.backend.pipelines.h3.weights import H3WeightPolicy as WeightPolicy

    pipe = h3_config(str(tiny_h3_dir), dtype="float32", weights=WeightPolicy(adaln="cache")).build_pipeline(0)
    m = pipe.run(t2va(decode=False)).manifest
    cache = m["adaln_cache"]["transformer"]
    assert cache["table_bytes"] > 0 and cache["weight_bytes_host"] > 0 and cache["weight_bytes_device"] == 0
    assert cache["table_keys"] >= 1 and len(m["stages"]["denoise_steps_s"]) == STEPS

@pytest.mark.slow
def test_h3_extend_manifest_lists_every_window_step(h3_pipe):
    """An extension runs one denoise per window: the manifest lists every step of every window."""
    import numpy as np

    from comfyui_h3.backend.pipelines.h3.request import H3ExtendRequest

    rng = np.random.default_rng(4)
    frames = rng.integers(0, 256, (124, 64, 96, 3), dtype=np.uint8)
    req = H3ExtendRequest(prompts=["waves"], added_frames=51, window_frames=56, overlap_frames=22, steps=2, seed=1,
                          source_frames=frames)
    result = h3_pipe.run(req)
    windows = len(result.extend["windows"])
    assert windows >= 2
    _check_common(result.manifest, 2 * windows)
    assert result.manifest["request"]["task"] == "extend" and result.manifest["request"]["steps"] == 2


def test_seedvr2_two_gloo_ranks_give_two_peaks(tmp_path):
    from comfyui_h3.backend.models.seedvr2.tiny import DIT_FILE, TEXT_FILE, VAE_FILE, make_tiny_seedvr2
    from comfyui_h3.backend.pipelines.seedvr2.family import seedvr2_config
    from comfyui_h3.backend.pipelines.seedvr2.request import UpscaleRequest

    root = make_tiny_seedvr2(tmp_path / "m", "3b")
    engine = Engine(seedvr2_config(root / DIT_FILE.format(variant="3b"), root / VAE_FILE, root / TEXT_FILE,
                                   dtype="float32", vae_dtype="float32", world_size=2, cpu_threads=1))
    video = torch.randint(0, 256, (9, 16, 24, 3), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    try:
        m = engine.generate(UpscaleRequest(video, scale=2.0)).manifest
    finally:
        engine.shutdown()
    assert [p["rank"] for p in m["peak_memory"]] == [0, 1]
    assert m["engine"]["family"] == "seedvr2" and m["engine"]["sp_degree"] == 2 and m["stages"]["total_s"] > 0

@pytest.mark.slow
def test_engine_fills_its_fields_and_two_gloo_ranks_give_two_peaks(tiny_h3_dir):
    engine = Engine(h3_config(str(tiny_h3_dir), dtype="float32", world_size=2, cpu_threads=1))
    try:
        first = engine.generate(t2va(steps=2, decode=False)).manifest
        second = engine.generate(t2va(steps=2, decode=False)).manifest
    finally:
        engine.shutdown()
    _check_common(first, 2)
    assert [p["rank"] for p in first["peak_memory"]] == [0, 1]
    assert all(p["device"] == "cpu" for p in first["peak_memory"])
    e = first["engine"]
    assert e["family"] == "h3" and e["sp_degree"] == 2 and e["devices"] == ["cpu", "cpu"]
    assert e["weights"]["adaln"] == "direct" and e["attention"]
    assert e["load_s"] > 0 and second["engine"]["load_s"] is None  # only the request that started the engine
    assert first["versions"]["torch"] == torch.__version__


def test_write_new_never_overwrites(tmp_path):
    target = tmp_path / "out.mp4.manifest.json"
    target.write_text("mine")
    with pytest.raises(FileExistsError, match="out.mp4.manifest.json"):
        mf.write_new(str(target), mf.new_manifest())
    assert target.read_text() == "mine"
    fresh = mf.write_new(str(tmp_path / "b.json"), mf.new_manifest())
    assert json.load(open(fresh))["schema"] == mf.SCHEMA
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json", "out.mp4.manifest.json"]  # no temporaries


# ---- CLI --manifest ----------------------------------------------------------------------------------------------

def _cli(*args, cwd, env_extra):
    import os
    import subprocess
    import sys

    repo = REPO_DIR
    env = dict(os.environ, PYTHONPATH=repo, **env_extra)
    return subprocess.run([sys.executable, "-m", "comfyui_h3", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def _generate(tmp_path, tiny_h3_dir, out, *extra):
    return _cli("generate", "--model", tiny_h3_dir, "--prompt", "rain on a tin roof", "--seconds", 5, "--width", 64,
                "--height", 64, "--steps", 2, "--device", "cpu", "--out", out, *extra, cwd=tmp_path,
                env_extra={"COMFYUI_H3_CACHE": str(tiny_h3_dir.parent)})


@pytest.mark.slow
def test_cli_generate_manifest_beside_the_output_and_never_over_a_file(tmp_path, tiny_h3_dir):
    out = tmp_path / "clips" / "a.mp4"
    run = _generate(tmp_path, tiny_h3_dir, out, "--manifest")
    assert run.returncode == 0, run.stderr
    side = tmp_path / "clips" / "a.mp4.manifest.json"
    assert run.stdout.split() == [str(out), str(side)]
    m = json.loads(side.read_text())
    assert len(m["stages"]["denoise_steps_s"]) == 2 and m["stages"]["encode_save_s"] > 0
    assert m["request"]["task"] == "t2va" and m["engine"]["sp_degree"] == 1 and m["engine"]["load_s"] > 0
    assert sorted(p.name for p in side.parent.iterdir()) == ["a.mp4", "a.mp4.manifest.json"]  # no temporaries

    # A user's file where the manifest would go: refused before any work; nothing written, theirs untouched.
    out2 = tmp_path / "clips" / "b.mp4"
    (tmp_path / "clips" / "b.mp4.manifest.json").write_text("user notes")
    run = _generate(tmp_path, tiny_h3_dir, out2, "--manifest")
    assert run.returncode == 2 and "b.mp4.manifest.json exists" in run.stderr, run.stderr
    assert not out2.exists() and (tmp_path / "clips" / "b.mp4.manifest.json").read_text() == "user notes"
    assert sorted(p.name for p in side.parent.iterdir()) == ["a.mp4", "a.mp4.manifest.json", "b.mp4.manifest.json"]


@pytest.mark.slow
def test_cli_generate_numbered_output_gets_its_manifest(tmp_path, tiny_h3_dir):
    """Without --out the video takes the next free number under ./output; its manifest follows that name."""
    run = _cli("generate", "--model", tiny_h3_dir, "--prompt", "x", "--seconds", 5, "--width", 64, "--height", 64,
               "--steps", 1, "--device", "cpu", "--manifest", cwd=tmp_path,
               env_extra={"COMFYUI_H3_CACHE": str(tiny_h3_dir.parent)})
    assert run.returncode == 0, run.stderr
    video = tmp_path / "output" / "h3_00001.mp4"
    assert run.stdout.split() == [str(video), str(video) + ".manifest.json"]
    assert len(json.loads((tmp_path / "output" / "h3_00001.mp4.manifest.json").read_text())["stages"][
        "denoise_steps_s"]) == 1


@pytest.mark.slow
def test_cli_upscale_manifest(tmp_path):
    from comfyui_h3.backend.media.save import write_mp4
    from comfyui_h3.tiny_model import ensure_tiny_seedvr2

    cache = tmp_path / "cache"
    ensure_tiny_seedvr2(cache / "tiny-seedvr2-3b")
    src = write_mp4(str(tmp_path / "in.mp4"), torch.randint(0, 256, (9, 32, 48, 3), dtype=torch.uint8), 24)
    out = tmp_path / "up.mp4"
    run = _cli("upscale", "--video", src, "--scale", 2, "--batch-frames", 5, "--overlap", 2, "--device", "cpu",
               "--out", out, "--manifest", cwd=tmp_path,
               env_extra={"COMFYUI_H3_CACHE": str(cache), "COMFYUI_H3_MODELS": ""})
    assert run.returncode == 0, run.stderr
    m = json.loads((tmp_path / "up.mp4.manifest.json").read_text())
    assert m["request"]["kind"] == "upscale" and m["request"]["shapes"]["output"] == [9, 64, 96]
    assert m["extra_stages"]["dit_s"] > 0 and len(m["extra_stages"]["batch_s"]) == m["request"]["shapes"]["batches"] == 3
    assert m["engine"]["family"] == "seedvr2"


# ---- ComfyUI nodes ------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_sample_node_summary_and_save_video_writes_the_manifest(tmp_path, tiny_h3_dir, monkeypatch):
    """H3 Sample attaches the manifest to its VIDEO and shows the summary line on the node; H3 Save Video writes
    `<file>.manifest.json` beside the MP4 (with its own seconds), and never over a file already there."""
    from comfyui_h3.backend.engine import shutdown_all
    from comfyui_h3.nodes import sample as sample_node
    from comfyui_h3.nodes.loader import H3ModelLoader
    from comfyui_h3.nodes.save_video import H3SaveVideo

    monkeypatch.setenv("COMFYUI_H3_OUTPUT", str(tmp_path / "out"))
    monkeypatch.setenv("COMFYUI_H3_MODELS", str(tiny_h3_dir.parent))
    shown = []
    real = sample_node.services.ProgressReporter

    class Reporter(real):
        def set_text(self, text):
            shown.append(text)

    monkeypatch.setattr(sample_node.services, "ProgressReporter", Reporter)
    (handle,) = H3ModelLoader().load(tiny_h3_dir.name, "cpu", "float32", "sdpa")
    try:
        out = sample_node.H3Sample().sample(handle, "waves on rocks", 5.0, 64, 64, 2, 12.0, 3.0, 3)
        video, _audio, _latents = out["result"]
    finally:
        shutdown_all()
    assert len(video.manifest["stages"]["denoise_steps_s"]) == 2
    assert shown and shown[-1] == mf.summary(video.manifest) and "s/step" in shown[-1]
    assert out["ui"]["text"] == [shown[-1]]  # and the same line as the node's ui output, which outlives the job

    entry = H3SaveVideo().save(video, "clips/h3", 18, "ultrafast")["ui"]["images"][0]
    saved = tmp_path / "out" / "clips" / entry["filename"]
    side = saved.parent / (saved.name + ".manifest.json")
    m = json.loads(side.read_text())
    assert m["stages"]["encode_save_s"] > 0 and m["request"]["task"] == "t2va"
    assert video.manifest["stages"]["encode_save_s"] is None  # the VIDEO's own manifest is not changed

    # The next free name's manifest is already a user's file: the video is saved, their file is left alone.
    nxt = saved.parent / (saved.name.replace("00001", "00002") + ".manifest.json")
    nxt.write_text("user notes")
    entry2 = H3SaveVideo().save(video, "clips/h3", 18, "ultrafast")["ui"]["images"][0]
    assert entry2["filename"] == saved.name.replace("00001", "00002") and nxt.read_text() == "user notes"

    # Images (no manifest) write none.
    entry3 = H3SaveVideo().save(filename_prefix="clips/img", crf=18, preset="ultrafast",
                                images=torch.rand(3, 32, 32, 3), fps=8.0)["ui"]["images"][0]
    assert not (saved.parent / (entry3["filename"] + ".manifest.json")).exists()
