"""H3 Track Mask on the tiny random SAM2 / SAM3 folders the package builds (they segment nothing meaningful: these
tests check what reaches transformers' processors and models, which frames are tracked in which direction, and what
the node returns), plus the model cache (the prompts parser, model folders and device choice: test_track_inputs.py)."""

import json
import sys
import types

import pytest
import torch

from repo_paths import REPO_DIR
from comfyui_h3 import comfy_services as services
from comfyui_h3.backend.media.mask_raster import combine_masks, fit_mask, grow_feather_invert
from comfyui_h3.backend.media.track_prompts import MAX_OBJECTS
from comfyui_h3.backend.tracking import sam_models, sam_tracker
from comfyui_h3.backend.tracking.sam_models import (TrackModelError, cached_track_models, clear_track_models,
                                                    load_track_model)
from comfyui_h3.backend.tracking.sam_tracker import FRAME_CHUNK, track_masks
from comfyui_h3.backend.tracking.tiny import SAM2_SIZE, SAM3_SIZE, make_tiny_sam2, make_tiny_sam3
from comfyui_h3.nodes.mask_draw import H3MaskDraw
from comfyui_h3.nodes.track_mask import TINY_SAM2_NAME, TINY_SAM3_NAME, H3TrackMask
from comfyui_h3.types import mask_shaping
from comfyui_h3.video_types import H3Video
from track_helpers import click, prompts

T, H, W = 8, 40, 64  # frames of the test clip (not square: x and y scale differently into the model's square)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """{"sam2": folder, "sam3": folder} in a cache folder laid out as the node's built-in names expect."""
    cache = tmp_path_factory.mktemp("track_cache")
    return {"sam2": make_tiny_sam2(cache / "tiny-sam2"), "sam3": make_tiny_sam3(cache / "tiny-sam3"), "cache": cache}


@pytest.fixture(scope="module")
def comfy_lane(request):
    """The real ComfyUI of the integration lane (tests/comfyui_lane.py), or a skip saying why there is none."""
    from comfyui_lane import COMFYUI_DIR, NO_COMFYUI

    if not COMFYUI_DIR:
        pytest.skip(NO_COMFYUI)
    return request.getfixturevalue("comfy")


@pytest.fixture
def node_env(tiny, monkeypatch):
    monkeypatch.setenv("COMFYUI_H3_CACHE", str(tiny["cache"]))
    monkeypatch.delenv("COMFYUI_H3_COMFY", raising=False)
    services.clear_interrupt()
    return H3TrackMask()


def frames(count=T, height=H, width=W, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (count, height, width, 3), generator=g).to(torch.uint8)


def close(got, want):
    return torch.allclose(torch.tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64), atol=1e-4)


def model(tiny, kind):
    return load_track_model(tiny[kind], "cpu")


def click_classes(kind):
    import transformers

    if kind == "sam2":
        return transformers.Sam2VideoProcessor, transformers.Sam2VideoModel, SAM2_SIZE
    return transformers.Sam3TrackerVideoProcessor, transformers.Sam3TrackerVideoModel, SAM3_SIZE


class Spy:
    """Records what reaches the processor (each add_inputs call and the session's stored inputs after it) and every
    model call (frame index, reverse flag)."""

    def __init__(self, monkeypatch, processor_cls, model_cls):
        self.added, self.calls = [], []
        original = processor_cls.add_inputs_to_inference_session
        spy = self

        def add_inputs(processor, inference_session, frame_idx, obj_ids, **kwargs):
            result = original(processor, inference_session, frame_idx, obj_ids, **kwargs)
            spy.session = inference_session
            oid = obj_ids if isinstance(obj_ids, int) else obj_ids[0]
            stored = inference_session.point_inputs_per_obj[inference_session.obj_id_to_idx(oid)][frame_idx]
            spy.added.append({"frame": frame_idx, "obj": oid, "size": (inference_session.video_height,
                                                                        inference_session.video_width),
                              "coords": stored["point_coords"][0, 0].tolist(),
                              "labels": stored["point_labels"][0, 0].tolist()})
            return result

        original_forward = model_cls.forward

        def forward(model_self, inference_session, frame_idx=None, frame=None, reverse=False, **kwargs):
            spy.calls.append((frame_idx, bool(reverse)))
            return original_forward(model_self, inference_session, frame_idx=frame_idx, frame=frame, reverse=reverse,
                                    **kwargs)

        monkeypatch.setattr(processor_cls, "add_inputs_to_inference_session", add_inputs)
        monkeypatch.setattr(model_cls, "forward", forward)


# -- what reaches the model -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["sam2", "sam3"])
def test_a_click_reaches_the_model_at_its_frame_in_the_models_coordinates(tiny, kind, monkeypatch):
    processor_cls, model_cls, size = click_classes(kind)
    spy = Spy(monkeypatch, processor_cls, model_cls)
    track_masks(model(tiny, kind), frames(), prompts({"id": 7, "points": [click(3, 40.0, 10.0),
                                                                           click(3, 8.0, 30.0, False)]}))
    assert len(spy.added) == 1
    added = spy.added[0]
    assert (added["frame"], added["obj"]) == (3, 7) and tuple(int(v) for v in added["size"]) == (H, W)
    # source pixels (x right, y down) scaled to the model's square input: x * size / W, y * size / H
    want = [[40.0 * size / W, 10.0 * size / H], [8.0 * size / W, 30.0 * size / H]]
    assert close(added["coords"], want)
    assert added["labels"] == [1, 0]  # a negative click is label 0
    assert spy.calls[0] == (3, False)  # the model runs on the prompted frame first (a conditioning frame)


@pytest.mark.parametrize("kind", ["sam2", "sam3"])
def test_a_box_reaches_the_model_as_its_two_corners_before_the_clicks(tiny, kind, monkeypatch):
    processor_cls, model_cls, size = click_classes(kind)
    spy = Spy(monkeypatch, processor_cls, model_cls)
    box = {"frame": 1, "x0": 8, "y0": 4, "x1": 48, "y1": 36}
    track_masks(model(tiny, kind), frames(), prompts({"id": 1, "boxes": [box], "points": [click(1, 20, 20, False)]}))
    (added,) = spy.added
    sx, sy = size / W, size / H
    assert close(added["coords"], [[8 * sx, 4 * sy], [48 * sx, 36 * sy], [20 * sx, 20 * sy]])
    assert added["labels"] == [2, 3, 0]  # SAM's box-corner labels, then the negative click


def test_a_box_past_the_frame_edge_is_cut_to_it(tiny, monkeypatch):
    processor_cls, model_cls, size = click_classes("sam2")
    spy = Spy(monkeypatch, processor_cls, model_cls)
    track_masks(model(tiny, "sam2"), frames(), prompts({"id": 1, "boxes": [
        {"frame": 0, "x0": -10, "y0": 5, "x1": W + 30, "y1": H + 1}]}))
    assert close(spy.added[0]["coords"], [[0, 5 * size / H], [size, size]])


def test_several_objects_each_get_their_own_inputs_and_the_mask_is_their_union(tiny, monkeypatch):
    sam2 = model(tiny, "sam2")
    a = {"id": 1, "points": [click(2, 12, 10)]}
    b = {"id": 2, "points": [click(2, 50, 30), click(2, 40, 5, False)]}
    alone_a, alone_b = track_masks(sam2, frames(), prompts(a)), track_masks(sam2, frames(), prompts(b))
    processor_cls, model_cls, _ = click_classes("sam2")
    spy = Spy(monkeypatch, processor_cls, model_cls)
    both = track_masks(sam2, frames(), prompts(a, b))
    assert [(x["obj"], x["labels"]) for x in spy.added] == [(1, [1]), (2, [1, 0])]
    assert not torch.equal(alone_a, alone_b)  # two different objects (else the union proves nothing)
    union = torch.maximum(alone_a, alone_b)
    # each object is tracked on its own; only their memories are encoded in one batch (float noise at most)
    assert (both != union).float().mean() < 0.005


def test_every_object_prompted_on_a_frame_gets_it_as_a_conditioning_frame(tiny, monkeypatch):
    """Object 1 (clicked on frames 2 and 5) is already in the session when object 2 (listed first) gets its click on
    frame 5: the model runs once for both there, so frame 5 conditions both (object 1 is not tracked onto frame 5
    first and its click then taken as a correction of that track)."""
    processor_cls, model_cls, _ = click_classes("sam2")
    spy = Spy(monkeypatch, processor_cls, model_cls)
    second = {"id": 2, "points": [click(5, 50, 30)]}
    first = {"id": 1, "points": [click(2, 12, 10), click(5, 14, 12)]}
    track_masks(model(tiny, "sam2"), frames(), prompts(second, first))
    assert [(x["frame"], x["obj"]) for x in spy.added] == [(2, 1), (5, 2), (5, 1)]
    assert spy.calls[:2] == [(2, False), (5, False)]  # one model call per prompted frame
    session = spy.session
    for oid, frames_ in ((1, [2, 5]), (2, [5])):
        outputs = session.output_dict_per_obj[session.obj_id_to_idx(oid)]
        assert sorted(outputs["cond_frame_outputs"]) == frames_, oid


def test_forward_and_backward_propagation_cover_every_frame_from_a_middle_prompt(tiny, monkeypatch):
    processor_cls, model_cls, _ = click_classes("sam2")
    spy = Spy(monkeypatch, processor_cls, model_cls)
    count, middle = 9, 4
    seen = []
    real = sam_tracker._track_clicks

    def record(model_, processor, track_model, frames_, prompts_, union, check, meter):
        real(model_, processor, track_model, frames_, prompts_, union, check, meter)
        seen.append(meter.done == meter.total)

    monkeypatch.setattr(sam_tracker, "_track_clicks", record)
    track_masks(model(tiny, "sam2"), frames(count), prompts({"id": 1, "points": [click(middle, 30, 20)]}))
    prompt, rest = spy.calls[0], spy.calls[1:]
    assert prompt == (middle, False)
    forward = [f for f, reverse in rest if not reverse]
    backward = [f for f, reverse in rest if reverse]
    assert forward == list(range(middle, count)) and backward == list(range(middle, -1, -1))
    assert sorted(set(forward) | set(backward)) == list(range(count))
    assert seen == [True]  # the progress total counted exactly these model calls (and the frames' preparation)


def test_objects_first_prompted_on_different_frames_are_tracked_away_from_their_own_prompts(tiny, monkeypatch):
    processor_cls, model_cls, _ = click_classes("sam2")
    spy = Spy(monkeypatch, processor_cls, model_cls)
    a = {"id": 1, "points": [click(2, 12, 10), click(6, 14, 12)]}  # a correction later on
    b = {"id": 2, "boxes": [{"frame": 5, "x0": 30, "y0": 10, "x1": 60, "y1": 38}]}
    track_masks(model(tiny, "sam2"), frames(), prompts(a, b))
    assert [(x["frame"], x["obj"]) for x in spy.added] == [(2, 1), (5, 2), (6, 1)]
    rest = spy.calls[3:]  # after one model call per prompted frame (2, 5, 6)
    # forward from the earliest prompt (object 1's), backward from object 2's first prompt down to frame 0
    assert [f for f, r in rest if not r] == list(range(2, T))
    assert [f for f, r in rest if r] == list(range(5, -1, -1))


def test_sam3_text_prompts_reach_the_session_and_mask_every_frame(tiny, monkeypatch):
    import transformers

    added = []
    original = transformers.Sam3VideoProcessor.add_text_prompt

    def add_text_prompt(processor, inference_session, text):
        added.append(list(text))
        return original(processor, inference_session, text)

    monkeypatch.setattr(transformers.Sam3VideoProcessor, "add_text_prompt", add_text_prompt)
    masks = track_masks(model(tiny, "sam3"), frames(), "", text=" the red car ;\n a dog ")
    assert added == [["the red car", "a dog"]]
    assert masks.shape == (T, H, W) and masks.dtype == torch.float32
    # the tiny SAM3's detection thresholds are 0, so its random detector reports (meaningless) objects
    assert masks.amax(dim=(1, 2)).tolist() == [1.0] * T


def test_frames_enter_the_session_in_chunks_exactly_as_the_processor_prepares_a_whole_video(tiny):
    sam2 = model(tiny, "sam2")
    clip = frames(FRAME_CHUNK + 3, 30, 50)
    processor = sam2.click_model()[1]
    ours = sam_tracker._open_session(processor, sam2, clip, None, sam_tracker._Progress(10 ** 6, None))
    whole = processor.init_video_session(video=clip, inference_device="cpu")
    assert ours.num_frames == whole.num_frames == FRAME_CHUNK + 3
    for index in range(ours.num_frames):
        assert torch.allclose(ours.get_frame(index), whole.get_frame(index), atol=1e-5), index


# -- the node ---------------------------------------------------------------------------------------------------------

def test_node_output_shape_dtype_and_range(node_env):
    video = H3Video(frames(), 24)
    pr = prompts({"id": 1, "points": [click(3, 30, 20)]})
    (hard,) = node_env.track(video, TINY_SAM2_NAME, pr, "", 0, 0, False)
    assert hard.shape == (T, H, W) and hard.dtype == torch.float32 and hard.device.type == "cpu"
    assert set(hard.unique().tolist()) <= {0.0, 1.0}
    (soft,) = node_env.track(video, TINY_SAM2_NAME, pr, "", 0, 5, True)
    assert soft.shape == (T, H, W) and soft.dtype == torch.float32
    assert float(soft.min()) >= 0.0 and float(soft.max()) <= 1.0
    (both,) = node_env.track(video, TINY_SAM3_NAME, pr, "the car", 0, 0, False)  # clicks and text on SAM3
    assert both.shape == (T, H, W)


@pytest.mark.parametrize("mode", ["union", "intersect", "subtract"])
def test_combine_grow_feather_invert_are_mask_draws(node_env, mode):
    video = H3Video(frames(), 24)
    pr = prompts({"id": 1, "points": [click(2, 20, 20)]}, {"id": 2, "points": [click(5, 50, 10)]})
    (tracked,) = node_env.track(video, TINY_SAM2_NAME, pr, "", 0, 0, False)
    drawn = torch.zeros(3, 20, 32)  # another node's mask: fewer frames, half size (fitted as Mask Draw fits it)
    drawn[:, 4:14, 6:20] = 1
    (out,) = node_env.track(video, TINY_SAM2_NAME, pr, "", 3, 4, True, mask=drawn, combine=mode)
    want = grow_feather_invert(combine_masks(tracked, fit_mask(drawn, T, H, W), mode), 3, 4, True)
    assert torch.equal(out, want)
    assert mask_shaping(out) == (3, 4)  # so H3 Edit adds no preset grow / feather, as after Mask Draw
    ours, theirs = H3TrackMask.INPUT_TYPES()["required"], H3MaskDraw.INPUT_TYPES()["required"]
    assert all(ours[name] == theirs[name] for name in ("grow", "feather", "invert"))


def test_stop_mid_propagation_raises_comfyuis_interrupt_and_keeps_the_model_usable(node_env, monkeypatch):
    import transformers

    mm = types.ModuleType("comfy.model_management")

    class InterruptProcessingException(Exception):
        pass

    mm.InterruptProcessingException = InterruptProcessingException
    mm.interrupt_processing = False
    mm.get_torch_device = lambda: torch.device("cpu")

    def throw_exception_if_processing_interrupted():
        if mm.interrupt_processing:
            mm.interrupt_processing = False
            raise InterruptProcessingException()

    mm.throw_exception_if_processing_interrupted = throw_exception_if_processing_interrupted
    mm.processing_interrupted = lambda: mm.interrupt_processing
    monkeypatch.setitem(sys.modules, "comfy.model_management", mm)

    video, pr = H3Video(frames(), 24), prompts({"id": 1, "points": [click(4, 30, 20)]})
    (clean,) = node_env.track(video, TINY_SAM2_NAME, pr, "", 0, 0, False)
    loaded = cached_track_models()
    calls = []
    original = transformers.Sam2VideoModel.forward

    def forward(model_self, inference_session, frame_idx=None, reverse=False, **kwargs):
        calls.append(frame_idx)
        if len(calls) == 3:  # the user presses Stop during the forward pass
            mm.interrupt_processing = True
        return original(model_self, inference_session, frame_idx=frame_idx, reverse=reverse, **kwargs)

    monkeypatch.setattr(transformers.Sam2VideoModel, "forward", forward)
    with pytest.raises(InterruptProcessingException):
        node_env.track(video, TINY_SAM2_NAME, pr, "", 0, 0, False)
    assert len(calls) == 3  # stopped at the next frame, not at the end of the clip
    monkeypatch.setattr(transformers.Sam2VideoModel, "forward", original)
    sam2 = next(m for m in cached_track_models() if m.kind == "sam2")
    (net,) = sam2.loaded()
    assert not net._forward_pre_hooks and not net._forward_hooks  # nothing of the run left on it
    (again,) = node_env.track(video, TINY_SAM2_NAME, pr, "", 0, 0, False)
    assert torch.equal(again, clean) and cached_track_models() == loaded  # same model object, same result


def test_stop_reaches_between_the_objects_of_a_frame_with_the_most_objects_allowed(node_env, monkeypatch):
    """One model call runs every object of a frame in turn: Stop used to wait for all of them (5000 objects: 89 s).
    Now it is checked before each object's mask decode, so at most the object being decoded finishes."""
    import time

    from transformers.models.sam2_video.modeling_sam2_video import Sam2VideoMaskDecoder as decoder_cls

    calls, asked = [], []
    original = decoder_cls.forward

    def forward(module, *args, **kwargs):
        calls.append(1)
        if len(calls) == 40:  # Stop pressed while the second frame's objects are decoded
            services.request_interrupt()
            asked.append((len(calls), time.monotonic()))
        return original(module, *args, **kwargs)

    monkeypatch.setattr(decoder_cls, "forward", forward)
    many = [{"id": i + 1, "points": [click(i % 2, 2 + i, 3 + i % 30)]} for i in range(MAX_OBJECTS)]
    with pytest.raises(services.interrupt_exception_types()):
        node_env.track(H3Video(frames(), 24), TINY_SAM2_NAME, prompts(*many), "", 0, 0, False)
    (at, when), = asked
    assert len(calls) == at  # no other object was decoded after the request
    assert time.monotonic() - when < 30  # generous: the old code decoded the other 20+ objects of the frame first


@pytest.mark.slow
def test_a_session_holds_a_fixed_window_of_frames_and_tracks_the_same(tiny, monkeypatch):
    """The session used to keep every object's outputs (full-size masks included) for every frame: memory grew with
    objects x frames (5000 objects: 4.7 GB). Now it keeps the tracker's reach either side, with the same masks."""
    import transformers

    count = 48
    loaded = model(tiny, "sam2")
    reach = sam_tracker.memory_reach(loaded.click_model()[0])
    assert count > 2 * reach + 2  # long enough that keeping everything would show
    seen = {"tracked": 0, "full_size": 0}
    original = transformers.Sam2VideoModel.forward

    def forward(model_self, inference_session, frame_idx=None, **kwargs):
        for outputs in inference_session.output_dict_per_obj.values():  # what the calls before this one left
            seen["tracked"] = max(seen["tracked"], len(outputs["non_cond_frame_outputs"]))
            seen["full_size"] += sum("high_res_masks" in out for kind in outputs.values() for out in kind.values())
        return original(model_self, inference_session, frame_idx=frame_idx, **kwargs)

    monkeypatch.setattr(transformers.Sam2VideoModel, "forward", forward)
    clip = frames(count)
    pr = prompts({"id": 1, "points": [click(5, 30, 20)]}, {"id": 2, "points": [click(40, 10, 30)]})
    trimmed = track_masks(loaded, clip, pr)
    assert seen["full_size"] == 0 and 0 < seen["tracked"] <= 2 * reach + 1
    monkeypatch.setattr(sam_tracker, "_trim", lambda *args: None)  # keep everything: the reference
    assert torch.equal(track_masks(loaded, clip, pr), trimmed)


def test_a_text_prompt_on_sam2_and_nothing_to_track_are_clear_errors(node_env):
    video = H3Video(frames(), 24)
    with pytest.raises(ValueError, match="a text prompt needs a SAM3 model, and tiny-sam2 is a SAM2 model"):
        node_env.track(video, TINY_SAM2_NAME, prompts({"id": 1, "points": [click(0, 1, 1)]}), "the car")
    with pytest.raises(ValueError, match="nothing to track: place clicks or a box"):
        node_env.track(video, TINY_SAM2_NAME, "", "  ")
    with pytest.raises(ValueError, match="past the video's last frame \\(7\\)"):
        node_env.track(video, TINY_SAM3_NAME, prompts({"id": 1, "points": [click(8, 1, 1)]}), "")
    assert H3TrackMask.VALIDATE_INPUTS('{"version": 1, "objects": [{"id": 1}]}') == (
        "H3 Track Mask: prompts: object 1 has no clicks and no box; give it one or remove it.")
    assert H3TrackMask.VALIDATE_INPUTS(prompts({"id": 1, "points": [click(0, 1, 1)]})) is True


# -- models: cache and device -----------------------------------------------------------------------------------------

def test_models_load_once_per_folder_device_and_dtype(tiny):
    clear_track_models()
    first = load_track_model(tiny["sam2"], "cpu")
    assert load_track_model(tiny["sam2"], "cpu") is first
    assert load_track_model(tiny["sam2"], "cpu", torch.float64) is not first  # another dtype: another load
    assert first.click_model()[0].dtype == torch.float32 and first.reads_text is False
    with pytest.raises(TrackModelError, match="tiny-sam2 is a SAM2 model: it takes no text prompt"):
        first.text_model()
    sam3 = load_track_model(tiny["sam3"], "cpu")
    assert sam3.reads_text and sam3.loaded() == []  # SAM3 loads the part a run needs, when it needs it
    assert sam3.click_model() is sam3.click_model()  # its tracker: loaded once, kept
    assert [type(m).__name__ for m in sam3.loaded()] == ["Sam3TrackerVideoModel"]  # the detector not loaded
    sam3.text_model()
    assert sorted(type(m).__name__ for m in sam3.loaded()) == ["Sam3TrackerVideoModel", "Sam3VideoModel"]
    assert len(cached_track_models()) == sam_models.MAX_CACHED  # the least recently used left
    clear_track_models()
    assert cached_track_models() == [] and load_track_model(tiny["sam2"], "cpu") is not first


@pytest.mark.slow
def test_the_bench_runs_its_tiny_dry_run(tmp_path):
    """bench/track_mask.py --tiny: the GPU bench's whole path (build, save, load as the node loads, track, time) on
    the CPU, ending in one JSON line."""
    import os
    import subprocess

    repo = REPO_DIR
    out = subprocess.run([sys.executable, os.path.join(repo, "bench", "track_mask.py"), "--tiny", "--json",
                          str(tmp_path / "r.json")], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == json.loads((tmp_path / "r.json").read_text())
    assert (result["frames"], result["width"], result["height"], result["device"]) == (6, 64, 40, "cpu")
    assert result["model_calls"] == 1 + 3 + 4  # the prompt, forward from frame 3 (3..5), backward (3..0)
    assert result["s_per_frame"] > 0 and result["prep_s_per_frame"] >= 0


# -- a real ComfyUI (the integration lane; skipped without COMFYUI_DIR) -----------------------------------------------

def _lane_prompt(track_inputs: dict) -> dict:
    from comfyui_lane import WORKFLOWS

    shipped = json.loads((WORKFLOWS / "h3_object_removal_clicks.api.json").read_text())
    load = {**shipped["2"]["inputs"], "frame_load_cap": 24}  # the sample clip's first second
    return {
        "1": {"class_type": "H3_LoadVideo", "inputs": load},
        "2": {"class_type": "H3_TrackMask", "inputs": {"video": ["1", 0], "model": TINY_SAM2_NAME, "prompts": "",
                                                       "text": "", "grow": 0, "feather": 0, "invert": False,
                                                       **track_inputs}},
        "3": {"class_type": "H3_MaskPreview", "inputs": {"video": ["1", 0], "mask": ["2", 0], "color": "red",
                                                         "opacity": 0.5}},
    }


def test_track_mask_in_a_real_comfyui(comfy_lane):
    from comfyui_lane import combo_choices

    comfy = comfy_lane
    status, info = comfy.request("/object_info/H3_TrackMask")
    assert status == 200 and "H3_TrackMask" in info, comfy.why(str(info)[:2000])
    node = info["H3_TrackMask"]
    assert node["display_name"] == "H3 Track Mask" and node["output"] == ["MASK"]
    assert combo_choices(node["input"]["required"]["model"])[:2] == [TINY_SAM2_NAME, TINY_SAM3_NAME]
    for section in ("required", "optional"):
        for name, spec in node["input"][section].items():
            assert (spec[1] if len(spec) > 1 else {}).get("tooltip"), f"{name} has no tooltip"

    ran = comfy.request("/prompt", {"prompt": _lane_prompt({"prompts": prompts(
        {"id": 1, "points": [click(12, 96, 48), click(12, 150, 20, False)]})})})
    assert ran[0] == 200, comfy.why(str(ran))
    entry = comfy.wait_for_prompt(ran[1]["prompt_id"])
    events = [event for event, _ in entry["status"]["messages"]]
    assert entry["status"]["status_str"] == "success" and "execution_success" in events, comfy.why(str(entry))
    assert entry["outputs"].get("3"), comfy.why(str(entry))  # the preview of the tracked mask

    refused = comfy.request("/prompt", {"prompt": _lane_prompt({"prompts": "{"})})
    assert refused[0] == 400 and "prompts is not valid JSON" in json.dumps(refused[1]["node_errors"]["2"])

    wrong = comfy.request("/prompt", {"prompt": _lane_prompt({"prompts": prompts(
        {"id": 1, "points": [click(0, 9, 9)]}), "text": "the red square"})})
    assert wrong[0] == 200, comfy.why(str(wrong))
    entry = comfy.wait_for_prompt(wrong[1]["prompt_id"])
    errors = [data for event, data in entry["status"]["messages"] if event == "execution_error"]
    assert errors and "a text prompt needs a SAM3 model" in errors[0]["exception_message"], comfy.why(str(entry))
