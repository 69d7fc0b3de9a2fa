"""The pack as ComfyUI sees it: loaded by path as a package, node schemas (tooltips, IDs), queue-time validation,
and the nodes run end to end (loader -> sample -> save) into an output folder without overwriting."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from repo_paths import REPO_DIR



@pytest.mark.slow
def test_loads_by_path_like_comfyui_without_shadowing_its_nodes_module(tmp_path):
    # A clean interpreter, no install, cwd elsewhere: exactly how ComfyUI's loader imports custom_nodes/<folder>.
    script = textwrap.dedent(f"""
        import importlib.util, json, sys, types
        sys.modules["nodes"] = types.ModuleType("nodes")  # ComfyUI's own top-level module
        sentinel = sys.modules["nodes"]
        path = {os.path.join(REPO_DIR, "__init__.py")!r}
        spec = importlib.util.spec_from_file_location("custom_nodes.comfyui-h3", path,
                                                      submodule_search_locations=[{REPO_DIR!r}])
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        assert sys.modules["nodes"] is sentinel, "the pack shadowed ComfyUI's nodes module"
        print(json.dumps({{"nodes": sorted(module.NODE_CLASS_MAPPINGS), "web": module.WEB_DIRECTORY,
                           "names": module.NODE_DISPLAY_NAME_MAPPINGS}}))
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"H3_LoadImage", "H3_LoadVideo", "H3_ModelLoader", "H3_Sample", "H3_SaveVideo",
            "H3_VideoComponents"} <= set(info["nodes"])
    assert set(info["names"]) == set(info["nodes"])
    assert os.path.isdir(os.path.join(REPO_DIR, info["web"]))


def test_every_input_and_output_has_a_tooltip_and_ids_have_the_pack_prefix():
    from comfyui_h3.registration import NODE_CLASS_MAPPINGS

    for node_id, cls in NODE_CLASS_MAPPINGS.items():
        assert node_id.startswith("H3_") and not node_id.startswith(("MiniMax", "SeedVR2", "Minimax"))
        spec = cls.INPUT_TYPES()
        for section in ("required", "optional"):
            for name, value in spec.get(section, {}).items():
                assert len(value) > 1 and value[1].get("tooltip"), f"{node_id}.{name} has no tooltip"
        tips = getattr(cls, "OUTPUT_TOOLTIPS", None if cls.RETURN_TYPES else ())  # (an output node may have none)
        assert isinstance(tips, tuple) and len(tips) == len(cls.RETURN_TYPES), f"{node_id} lacks OUTPUT_TOOLTIPS"
        assert all(isinstance(t, str) and t.strip() for t in tips), f"{node_id} has an empty output tooltip"
        assert cls.CATEGORY == "H3" and hasattr(cls, cls.FUNCTION)


def test_validators_report_once():
    """ComfyUI turns a VALIDATE_INPUTS string into one error per input the validator names (Sample named 4, Mask
    Draw 6 through **kwargs): each names at most the one input its checks concern."""
    import inspect

    from comfyui_h3.registration import NODE_CLASS_MAPPINGS

    for node_id, cls in NODE_CLASS_MAPPINGS.items():
        validate = getattr(cls, "VALIDATE_INPUTS", None)
        if validate is None:
            continue
        spec = inspect.getfullargspec(validate)
        named = [a for a in spec.args + spec.kwonlyargs if a != "cls"]
        assert spec.varkw is None and len(named) <= 1, f"{node_id}.VALIDATE_INPUTS names {named}"


def _declared_inputs(cls) -> dict:
    spec = cls.INPUT_TYPES()
    return {name: (value[0], value[1] if len(value) > 1 else {}) for section in ("required", "optional")
            for name, value in spec.get(section, {}).items()}


def _valid_values(kind, opts) -> list:
    """Values a widget can hold (a linked input is None at queue time)."""
    if isinstance(kind, list):
        return list(dict.fromkeys([opts.get("default", kind[0] if kind else None), *kind[:3]]))
    if kind in ("INT", "FLOAT"):
        return list(dict.fromkeys(v for v in (opts.get("min"), opts.get("default"), opts.get("max")) if v is not None))
    if kind == "STRING":
        return list(dict.fromkeys([opts.get("default", ""), "x"]))
    if kind == "BOOLEAN":
        return [False, True]
    return [None]


def _out_of_range_values(kind, opts) -> list:
    """Values ComfyUI itself refuses for this widget (outside min/max by one and by one step; not in the list)."""
    if isinstance(kind, list):
        return ["no-such-choice.mp4"]
    if kind not in ("INT", "FLOAT"):
        return []
    cast = int if kind == "INT" else float
    step = opts.get("step", 1) or 1
    values = []
    if "min" in opts:
        values += [cast(opts["min"] - 1), cast(opts["min"] - step)]
    if "max" in opts:
        values += [cast(opts["max"] + 1), cast(opts["max"] + step)]
    return values


def test_validators_leave_comfyui_its_range_and_choice_checks(tmp_path, monkeypatch):
    """ComfyUI skips its own min/max/list checks for every input a VALIDATE_INPUTS names (for every input of the node
    when it takes **kwargs): a validator must take no **kwargs, and must refuse what ComfyUI would have refused for
    each input it names (with the others at any valid value)."""
    import inspect
    import itertools

    from comfyui_h3.registration import NODE_CLASS_MAPPINGS

    monkeypatch.setenv("COMFYUI_H3_INPUT", str(tmp_path))  # file lists hold exactly these two files
    (tmp_path / "ok.png").write_bytes(b"")
    (tmp_path / "ok.mp4").write_bytes(b"")
    checked = 0
    for node_id, cls in NODE_CLASS_MAPPINGS.items():
        validate = getattr(cls, "VALIDATE_INPUTS", None)
        if validate is None:
            continue
        spec = inspect.getfullargspec(validate)
        assert spec.varkw is None, (f"{node_id}.VALIDATE_INPUTS takes **{spec.varkw}: ComfyUI then skips its range "
                                    "and choice checks for every input of the node")
        declared = _declared_inputs(cls)
        named = [a for a in spec.args if a in declared]
        for name in named:
            kind, opts = declared[name]
            others = [n for n in named if n != name]
            for combo in itertools.product(*(_valid_values(*declared[n]) for n in others)):
                base = dict(zip(others, combo))
                good = [v for v in _valid_values(kind, opts) if validate(**base, **{name: v}) is True]
                if not good:  # this combination of the others is refused anyway: it says nothing about `name`
                    continue
                for bad in _out_of_range_values(kind, opts):
                    checked += 1
                    verdict = validate(**base, **{name: bad})
                    assert verdict is not True, (f"{node_id}.VALIDATE_INPUTS names {name!r} (so ComfyUI does not "
                                                 f"check it) but accepts {name}={bad!r} with {base}")
    assert checked, "no named input with a range or a list was exercised"


def test_sample_refuses_an_empty_prompt_at_queue_time():
    from comfyui_h3.nodes.sample import H3Sample

    assert "prompt is empty" in H3Sample.VALIDATE_INPUTS(prompt="  ")
    assert H3Sample.VALIDATE_INPUTS(prompt="x") is True
    assert H3Sample.VALIDATE_INPUTS(prompt=None) is True  # a linked prompt


class _NoEngine:
    """An engine handle that must never be used: the request is refused before."""

    def engine(self):
        raise AssertionError("an engine was asked for a request that should have been refused")


@pytest.mark.parametrize("width,height,message", [
    (1344, 0, "width and height together"),
    (1344, 100, "multiples of 32"),
    (2048, 256, "aspect ratios"),
])
def test_sample_refuses_sizes_that_do_not_fit_before_any_engine_work(width, height, message):
    # Checks that need two inputs run when the node runs (VALIDATE_INPUTS names one input: see
    # test_validators_report_once), still before an engine is made or ComfyUI's memory freed.
    from comfyui_h3.nodes.sample import H3Sample

    with pytest.raises(ValueError, match=message):
        H3Sample().sample(_NoEngine(), "waves", 5.0, width, height, 2, 12.0, 3.0, 0)


@pytest.mark.slow
def test_nodes_end_to_end_and_never_overwrite(tmp_path, monkeypatch, tiny_h3_dir):
    import av
    import numpy as np
    import torch

    from comfyui_h3.backend.engine import shutdown_all
    from comfyui_h3.nodes.load_image import H3LoadImage
    from comfyui_h3.nodes.loader import H3ModelLoader
    from comfyui_h3.nodes.sample import H3Sample
    from comfyui_h3.nodes.save_video import H3SaveVideo
    from PIL import Image

    monkeypatch.setenv("COMFYUI_H3_OUTPUT", str(tmp_path / "out"))
    monkeypatch.setenv("COMFYUI_H3_INPUT", str(tmp_path / "in"))
    monkeypatch.setenv("COMFYUI_H3_MODELS", str(tiny_h3_dir.parent))
    os.makedirs(tmp_path / "in")
    Image.fromarray(np.full((40, 72, 3), 200, np.uint8)).save(tmp_path / "in" / "key.png")
    assert "key.png" in H3LoadImage.INPUT_TYPES()["required"]["image"][0]
    assert tiny_h3_dir.name in H3ModelLoader.INPUT_TYPES()["required"]["model"][0]

    (handle,) = H3ModelLoader().load(tiny_h3_dir.name, "cpu", "float32", "sdpa")
    (image,) = H3LoadImage().load("key.png")
    assert tuple(image.shape) == (1, 40, 72, 3) and image.dtype == torch.float32
    try:
        out = H3Sample().sample(handle, "waves on rocks", 5.0, 0, 0, 2, 12.0, 3.0, 3, first_frame=image)
    finally:
        shutdown_all()
    video, audio, latents = out["result"]
    # the end-of-run line is a ui output (a frontend that clears progress texts at job end keeps it)
    assert "s/step" in out["ui"]["text"][0]
    assert video.get_frame_count() == 124 and float(video.get_frame_rate()) == 24.0
    assert video.get_dimensions() == (128, 64)  # the keyframe's ~16:9 aspect on the tiny canvas
    assert audio["sample_rate"] == 32000 and audio["waveform"].shape[:2] == (1, 2)
    assert tuple(latents.video.shape) == (1, 24, 37, 4, 8)

    first = H3SaveVideo().save(video, "clips/h3", 18, "ultrafast")["ui"]["images"][0]
    second = H3SaveVideo().save(video, "clips/h3", 18, "ultrafast")["ui"]["images"][0]
    assert first["filename"] != second["filename"] and first["subfolder"] == "clips"
    with av.open(str(tmp_path / "out" / "clips" / first["filename"])) as container:
        assert container.streams.video[0].frames in (0, 124)
        frames = sum(1 for _ in container.decode(video=0))
        assert frames == 124 and container.streams.audio[0].rate == 32000
        assert container.streams.audio[0].channels == 2


def test_outside_paths_are_refused(monkeypatch, tmp_path):
    from comfyui_h3.comfy_services import UnsafePathError
    from comfyui_h3.nodes.load_image import H3LoadImage

    monkeypatch.setenv("COMFYUI_H3_INPUT", str(tmp_path))
    assert H3LoadImage.VALIDATE_INPUTS("../../etc/passwd") is not True
    with pytest.raises((UnsafePathError, ValueError, FileNotFoundError)):
        H3LoadImage().load("../../etc/passwd")


@pytest.mark.parametrize("device,degree,gpus,want", [
    ("cpu", 2, "", ("cpu", 2)),
    ("cuda", 1, "", ("cuda", 1)),
    ("cuda", 4, "0,1,2,3", ("cuda:0,1,2,3", 4)),
    ("cuda", 2, "3, 5", ("cuda:3,5", 2)),
])
def test_loader_device_resolution(device, degree, gpus, want):
    from comfyui_h3.nodes.loader import resolve_devices

    assert resolve_devices(device, degree, gpus) == want


def test_loader_refuses_bad_gpu_lists_and_degrees(tiny_h3_dir, monkeypatch):
    from comfyui_h3.nodes.loader import H3ModelLoader, resolve_devices

    with pytest.raises(ValueError, match="one GPU per rank"):
        resolve_devices("cuda", 4, "0,1")
    with pytest.raises(ValueError, match="GPU ids"):
        resolve_devices("cuda", 2, "zero,one")
    monkeypatch.setenv("COMFYUI_H3_MODELS", str(tiny_h3_dir.parent))
    with pytest.raises(ValueError, match="does not divide"):
        H3ModelLoader().load(tiny_h3_dir.name, "cpu", "float32", "sdpa", 3, "")
    (handle,) = H3ModelLoader().load(tiny_h3_dir.name, "cpu", "float32", "sdpa", 2, "")
    assert handle.config.world_size == 2 and handle.config.device_for(1) == "cpu"


def test_run_engine_shows_the_summary_on_the_node_when_done(monkeypatch):
    """H3 Edit / H3 Extend pass summary=...: the text goes to the node's progress text (what ComfyUI's frontend shows
    in the node) once the run is done, after the per-step status lines."""
    from comfyui_h3.nodes import sample as sample_node

    shown = []

    class Reporter:
        def __init__(self, *args, **kwargs):
            pass

        def set_text(self, text):
            shown.append(text)

        def update_absolute(self, *args):
            pass

    class Engine:
        started = True

        def generate(self, request, progress, should_cancel):
            progress(1, 2)
            progress(2, 2)
            return "the result"

    class Handle:
        def engine(self):
            return Engine()

    class Request:
        def validate(self):
            pass

    monkeypatch.setattr(sample_node.services, "ProgressReporter", Reporter)
    result = sample_node.run_engine(Handle(), Request(), 2, node_id="5", status=lambda d, t: f"step {d}/{t}",
                                    summary=lambda r: f"done: {r}")
    assert result == "the result" and shown == ["step 1/2", "step 2/2", "done: the result"]
