"""H3 Track Mask's inputs before any model runs: the prompts parser (format and limits: backend/media/track_prompts.py),
finding and refusing SAM model folders, the transformers it needs, and the device tracking runs on. The tracking
itself is in test_track_mask.py."""

import json
import sys
import types

import pytest
import torch

from comfyui_h3 import comfy_services as services
from comfyui_h3.backend.errors import RequestError
from comfyui_h3.backend.media.track_prompts import (MAX_CLICKS_PER_FRAME, MAX_OBJECTS, MAX_PROMPTED_FRAMES,
                                                    check_against_video, parse_prompts)
from comfyui_h3.backend.tracking import sam_models
from comfyui_h3.backend.tracking.sam_models import TrackModelError, load_track_model, model_kind, pick_device
from comfyui_h3.nodes.track_mask import H3TrackMask
from track_helpers import click, prompts


# -- prompts ----------------------------------------------------------------------------------------------------------

def test_prompts_are_bounded_by_what_the_tracker_takes():
    ok = [{"id": i + 1, "points": [click(0, 1, 1)]} for i in range(MAX_OBJECTS)]
    assert len(parse_prompts(prompts(*ok)).objects) == MAX_OBJECTS
    too_many = ok + [{"id": MAX_OBJECTS + 1, "points": [click(0, 1, 1)]}]
    message = H3TrackMask.VALIDATE_INPUTS(prompts(*too_many))
    assert message.startswith(f"H3 Track Mask: prompts hold {MAX_OBJECTS + 1} objects; H3 Track Mask tracks at "
                              f"most {MAX_OBJECTS}") and "second H3 Track Mask" in message
    flood = [{"id": i + 1, "points": [click(0, 1, 1)]} for i in range(5000)]  # the outside pass's prompt
    assert H3TrackMask.VALIDATE_INPUTS(prompts(*flood)).startswith("H3 Track Mask: prompts hold 5000 objects")
    crowded = {"id": 4, "points": [click(3, i, 1) for i in range(MAX_CLICKS_PER_FRAME)]}
    parse_prompts(prompts(crowded))
    crowded["points"].append(click(3, 9, 9, positive=False))
    with pytest.raises(RequestError, match=f"object 4 has {MAX_CLICKS_PER_FRAME + 1} clicks on frame 3; SAM2 "
                                           f"takes at most {MAX_CLICKS_PER_FRAME}"):
        parse_prompts(prompts(crowded))
    spread = {"id": 2, "points": [click(f, 1, 1) for f in range(MAX_PROMPTED_FRAMES - 1)],
              "boxes": [{"frame": 99, "x0": 0, "y0": 0, "x1": 4, "y1": 4}]}
    parse_prompts(prompts(spread))
    spread["boxes"].append({"frame": 100, "x0": 0, "y0": 0, "x1": 4, "y1": 4})
    with pytest.raises(RequestError, match=f"object 2 is prompted on {MAX_PROMPTED_FRAMES + 1} frames"):
        parse_prompts(prompts(spread))


@pytest.mark.parametrize("text,message", [
    ("{", "prompts is not valid JSON"),
    ("[1]", "must be a JSON object"),
    ('{"version": 2, "objects": []}', "version 2 is not supported"),
    (prompts({"id": 0, "points": [click(0, 1, 1)]}), "needs a positive integer id, got 0"),
    (prompts({"id": True, "points": [click(0, 1, 1)]}), "needs a positive integer id, got True"),
    (prompts({"id": 3, "points": [click(0, 1, 1)]}, {"id": 3, "points": [click(1, 1, 1)]}),
     "object id 3 appears twice"),
    (prompts({"id": 1, "points": [click(-1, 1, 1)]}), "needs a frame index \\(an integer >= 0\\), got -1"),
    (prompts({"id": 1, "points": [click(1.5, 1, 1)]}), "got 1.5"),
    (prompts({"id": 1, "points": [{"frame": 0, "x": "a", "y": 1}]}), "finite number for 'x'"),
    (prompts({"id": 1, "points": [{"frame": 0, "x": 1, "y": 1, "positive": "yes"}]}), "'positive' true or false"),
    (prompts({"id": 1, "boxes": [{"frame": 0, "x0": 5, "y0": 1, "x1": 5, "y1": 9}]}),
     "object 1's box on frame 0 has x1 \\(5\\) <= x0 \\(5\\)"),
    (prompts({"id": 1, "boxes": [{"frame": 0, "x0": 1, "y0": 9, "x1": 5, "y1": 2}]}), "y1 \\(2\\) <= y0 \\(9\\)"),
    (prompts({"id": 1, "boxes": [{"frame": 2, "x0": 0, "y0": 0, "x1": 5, "y1": 5},
                                 {"frame": 2, "x0": 1, "y0": 1, "x1": 6, "y1": 6}]}), "two boxes on frame 2"),
    (prompts({"id": 1}), "object 1 has no clicks and no box"),
])
def test_bad_prompts_are_one_line_request_errors(text, message):
    with pytest.raises(RequestError, match=message) as info:
        parse_prompts(text)
    assert "\n" not in str(info.value)


def test_prompts_against_the_video():
    ok = parse_prompts(prompts({"id": 2, "points": [click(7, 64, 0)], "extra": "kept by the editor"}))
    assert check_against_video(ok, 8, 64, 40).objects[0].clicks[0].frame == 7
    assert parse_prompts("").empty and parse_prompts('{"version": 1, "objects": []}').empty
    with pytest.raises(RequestError, match="object 2's click is on frame 7, past the video's last frame \\(6\\)"):
        check_against_video(ok, 7, 64, 40)
    with pytest.raises(RequestError, match="click \\(64.5, 0\\) on frame 7 is outside the 64x40 frame"):
        check_against_video(parse_prompts(prompts({"id": 2, "points": [click(7, 64.5, 0)]})), 8, 64, 40)
    with pytest.raises(RequestError, match="lies outside the 64x40 frame"):
        check_against_video(parse_prompts(prompts({"id": 1, "boxes": [
            {"frame": 0, "x0": 70, "y0": 1, "x1": 90, "y1": 9}]})), 8, 64, 40)


# -- model folders, transformers, device ------------------------------------------------------------------------------

def test_missing_or_foreign_model_folders_are_clear_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("COMFYUI_H3_MODELS", raising=False)
    with pytest.raises(services.TrackModelNotFound, match="models/sam2/.*models/sam3/"):
        services.resolve_track_model("sam2.1-hiera-large", roots=[str(tmp_path)])
    with pytest.raises(TrackModelError, match="SAM model folder not found"):
        load_track_model(tmp_path / "nowhere", "cpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrackModelError, match="has no config.json"):
        model_kind(str(tmp_path / "empty"))
    for model_type, message in (("llama", "not a SAM2 / SAM3 video model folder"),
                                ("sam3", "SAM3 image model"), ("sam3_tracker_video", "without its detector")):
        folder = tmp_path / model_type
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
        with pytest.raises(TrackModelError, match=message):
            load_track_model(folder, "cpu")
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    (weightless / "config.json").write_text(json.dumps({"model_type": "sam2_video"}))
    with pytest.raises(TrackModelError, match=f"could not load the SAM2 model in {weightless}"):
        load_track_model(weightless, "cpu")


def test_an_old_transformers_is_a_clear_error(monkeypatch):
    old = types.ModuleType("transformers")
    old.__version__ = "4.50.0"
    old.Sam2VideoModel = old.Sam2VideoProcessor = object  # SAM2 video but no SAM3
    monkeypatch.setitem(sys.modules, "transformers", old)
    sam_models.check_transformers("sam2")
    with pytest.raises(TrackModelError, match="needs a transformers with Sam3VideoModel .* transformers 4.50.0"):
        sam_models.check_transformers("sam3")


def test_discovery_lists_sam_folders_in_models_sam2_and_sam3(tmp_path, monkeypatch):
    base = tmp_path / "ComfyUI"
    fp = types.ModuleType("folder_paths")
    fp.models_dir = str(base / "models")
    fp.folder_names_and_paths = {"sam2": ([str(base / "models" / "sam2")], {".safetensors"})}  # another pack's

    def add_model_folder_path(folder_name, full_folder_path, is_default=False):
        paths = fp.folder_names_and_paths.setdefault(folder_name, ([], set()))[0]
        if full_folder_path not in paths:
            paths.append(full_folder_path)

    fp.add_model_folder_path = add_model_folder_path
    fp.get_folder_paths = lambda name: fp.folder_names_and_paths[name][0][:]
    monkeypatch.setitem(sys.modules, "folder_paths", fp)
    monkeypatch.delenv("COMFYUI_H3_MODELS", raising=False)
    monkeypatch.delenv("COMFYUI_H3_COMFY", raising=False)

    def folder(path, model_type):
        path.mkdir(parents=True)
        (path / "config.json").write_text(json.dumps({"model_type": model_type}))

    folder(base / "models" / "sam2" / "facebook" / "sam2.1-hiera-large", "sam2_video")
    folder(base / "models" / "sam3" / "sam3", "sam3_video")
    folder(base / "models" / "sam3" / "not-sam", "llama")
    (base / "models" / "sam2" / "sam2.1_hiera_large.safetensors").write_bytes(b"")  # another pack's single file
    assert services.track_model_dirs() == ["facebook/sam2.1-hiera-large", "sam3"]
    assert H3TrackMask.INPUT_TYPES()["required"]["model"][0][2:] == ["facebook/sam2.1-hiera-large", "sam3"]
    assert services.resolve_track_model("sam3") == str(base / "models" / "sam3" / "sam3")
    with pytest.raises(services.UnsafePathError):
        services.resolve_track_model("../sam3/sam3")
    with pytest.raises(services.UnsafePathError):
        services.resolve_track_model(str(tmp_path))


def test_device_is_a_gpu_comfyui_does_not_use():
    free = {0: 50, 1: 10, 2: 30}.__getitem__
    assert pick_device("cuda:0", 3, free) == torch.device("cuda", 2)  # the other GPU with the most free memory
    assert pick_device(torch.device("cuda", 2), 3, free) == torch.device("cuda", 0)
    assert pick_device("cuda:0", 1, free) == torch.device("cuda", 0)  # the only GPU: ComfyUI's
    assert pick_device("cpu", 3, free) == torch.device("cpu")  # ComfyUI runs --cpu: so does tracking
    assert pick_device(None, 3, free) == torch.device("cuda", 0)  # headless: the GPU with the most free memory
    assert pick_device(None, 0, free) == torch.device("cpu")

    def broken(index):
        if index == 2:
            raise RuntimeError("no info")
        return 5

    assert pick_device("cuda:0", 3, broken) == torch.device("cuda", 1)
