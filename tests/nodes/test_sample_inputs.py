"""The sample inputs the shipped workflows name: real, small files in the package, copied into an input folder (ComfyUI's
when the pack loads) without ever replacing a file that is there."""

import errno
import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from repo_paths import REPO_DIR
from comfyui_h3.install_samples import SAMPLE_DIR, SAMPLE_FILES, install_sample_inputs



def test_the_samples_are_real_small_files():
    import av
    from PIL import Image

    assert sum(os.path.getsize(os.path.join(SAMPLE_DIR, n)) for n in SAMPLE_FILES) < 400 * 1024
    for name in ("h3_demo_first.png", "h3_demo_last.png"):
        with Image.open(os.path.join(SAMPLE_DIR, name)) as image:
            image.load()
            assert image.size == (336, 192) and image.mode == "RGB"
    with av.open(os.path.join(SAMPLE_DIR, "h3_demo_source.mp4")) as container:
        assert container.streams.audio and container.streams.video[0].codec_context.name == "h264"
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == 130 and frames[0].shape == (96, 192, 3)  # >= 124 frames: enough for H3 Edit


def test_the_shipped_workflows_name_exactly_these_inputs():
    from comfyui_h3.templates import workflows_dir

    named = set()
    for name in (n for n in os.listdir(workflows_dir()) if n.endswith(".api.json")):
        for node in json.loads((workflows_dir() / name).read_text()).values():
            for key in ("video", "image"):
                value = node["inputs"].get(key)
                if node["class_type"] in ("H3_LoadVideo", "H3_LoadImage") and isinstance(value, str):
                    named.add(value)
    assert named == set(SAMPLE_FILES)


def _bytes(folder) -> dict:
    return {n: (folder / n).read_bytes() for n in sorted(os.listdir(folder))}


def test_copies_what_is_missing_and_never_replaces_a_users_file(tmp_path, caplog):
    dest = tmp_path / "input"
    dest.mkdir()
    (dest / "h3_demo_first.png").write_bytes(b"my own keyframe")
    with caplog.at_level(logging.INFO, logger="comfyui_h3"):
        outcome = install_sample_inputs(str(dest))
    assert outcome == {"h3_demo_source.mp4": "copied", "h3_demo_first.png": "kept", "h3_demo_last.png": "copied"}
    assert (dest / "h3_demo_first.png").read_bytes() == b"my own keyframe"
    for name in ("h3_demo_source.mp4", "h3_demo_last.png"):
        assert (dest / name).read_bytes() == open(os.path.join(SAMPLE_DIR, name), "rb").read()
    kept = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(kept) == 1 and "h3_demo_first.png" in kept[0].getMessage() and "left as it is" in kept[0].getMessage()
    assert sorted(os.listdir(dest)) == sorted(SAMPLE_FILES)  # no temporary file left behind

    before = _bytes(dest)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="comfyui_h3"):
        again = install_sample_inputs(str(dest))
    assert again == {"h3_demo_source.mp4": "present", "h3_demo_first.png": "kept", "h3_demo_last.png": "present"}
    assert _bytes(dest) == before


def test_a_file_that_appears_while_copying_is_kept(tmp_path, monkeypatch):
    real_link = os.link

    def user_wins(src, dst, *a, **kw):  # the user's file lands between the check and the publish
        with open(dst, "wb") as handle:
            handle.write(b"theirs")
        return real_link(src, dst, *a, **kw)

    monkeypatch.setattr(os, "link", user_wins)
    outcome = install_sample_inputs(str(tmp_path), names=("h3_demo_last.png",))
    assert outcome == {"h3_demo_last.png": "kept"}
    assert (tmp_path / "h3_demo_last.png").read_bytes() == b"theirs" and os.listdir(tmp_path) == ["h3_demo_last.png"]


def test_without_hard_links_it_still_copies_whole_files(tmp_path, monkeypatch):
    def no_links(*_a, **_kw):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    assert set(install_sample_inputs(str(tmp_path)).values()) == {"copied"}
    assert _bytes(tmp_path) == {n: open(os.path.join(SAMPLE_DIR, n), "rb").read() for n in sorted(SAMPLE_FILES)}


def test_failures_are_reported_not_raised(tmp_path, monkeypatch, caplog):
    # Loading the pack must never fail on this: an input folder that cannot be made, a full disk.
    (tmp_path / "a_file").write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="comfyui_h3"):
        assert set(install_sample_inputs(str(tmp_path / "a_file" / "input")).values()) == {"failed"}
    assert "cannot create the input folder" in caplog.text

    def disk_full(*_a, **_kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    import tempfile

    monkeypatch.setattr(tempfile, "mkstemp", disk_full)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="comfyui_h3"):
        assert set(install_sample_inputs(str(tmp_path / "in")).values()) == {"failed"}
    assert "No space left on device" in caplog.text and os.listdir(tmp_path / "in") == []


@pytest.mark.slow
def test_loading_the_pack_in_comfyui_installs_them(tmp_path):
    """The pack as ComfyUI loads it (folder_paths and model management already imported): the samples appear in
    ComfyUI's input folder, a same-named different file stays, and the log says so."""
    dest = tmp_path / "input"
    dest.mkdir()
    (dest / "h3_demo_source.mp4").write_bytes(b"a clip of mine")
    script = textwrap.dedent(f"""
        import importlib.util, logging, sys, types
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        folder_paths = types.ModuleType("folder_paths")
        folder_paths.get_input_directory = lambda: {str(dest)!r}
        sys.modules["folder_paths"] = folder_paths
        sys.modules["comfy"] = types.ModuleType("comfy")
        sys.modules["comfy.model_management"] = types.ModuleType("comfy.model_management")
        spec = importlib.util.spec_from_file_location("comfyui-h3", {os.path.join(REPO_DIR, "__init__.py")!r},
                                                      submodule_search_locations=[{REPO_DIR!r}])
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COMFYUI_H3_COMFY")}
    env["COMFYUI_H3_PREWARM"] = "0"  # no worker forkserver for this check
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert sorted(os.listdir(dest)) == sorted(SAMPLE_FILES)
    assert (dest / "h3_demo_source.mp4").read_bytes() == b"a clip of mine"
    assert "h3_demo_source.mp4 already exists and is not the pack's sample input" in out.stderr, out.stderr
