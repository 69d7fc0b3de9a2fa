"""One rule per input, whichever layer meets it first (issue 28 #19): extend --windows 0, out-of-range mask grow /
feather, the steps bound of the nodes and the CLI, --frames quoting the user's count, --model naming a file, the
latents' file mode, FFmpeg's errno text, a still image renamed .mp4. Each case fails before any model is built."""

import os

import pytest
import torch

from comfyui_h3.cli import main


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("error: ") and err.count("\n") == 1, err
    return err


def _tiny_mp4(path, frames=9):
    from comfyui_h3.backend.media.save import write_mp4

    noise = torch.randint(0, 256, (frames, 64, 64, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    write_mp4(str(path), noise, 24.0, None, None)
    return path


@pytest.mark.parametrize("windows", ["0", "-2"])
def test_extend_windows_below_one_is_refused_naming_the_option(tmp_path, capsys, windows):
    video = _tiny_mp4(tmp_path / "v.mp4")
    with pytest.raises(SystemExit) as stop:  # argparse's usage error (exit 2), before any decode
        main(["extend", "--video", str(video), "--windows", windows, "--prompt", "x", "--out",
              str(tmp_path / "long.mp4")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--windows" in err and f"'{windows}' is not a whole number >= 1" in err, err
    assert "Traceback" not in err and not (tmp_path / "long.mp4").exists()


def test_extend_windows_give_whole_windows(tmp_path):
    from comfyui_h3.cli import _parser
    from comfyui_h3.cli_extend import build_request

    video = _tiny_mp4(tmp_path / "v.mp4")
    args = _parser().parse_args(["extend", "--video", str(video), "--windows", "2", "--prompt", "x", "--out", "o.mp4"])
    request = build_request(args, str(tmp_path / "o.mp4"))
    assert request.added_frames == 2 * (args.window_frames - args.overlap_frames)


@pytest.mark.parametrize("field", ["mask_grow", "mask_feather"])
@pytest.mark.parametrize("value", [-5, -2, 513])
def test_mask_shaping_out_of_range_is_refused_not_replaced_by_the_preset(field, value):
    from comfyui_h3.backend.pipelines.h3.editing import PRESETS, resolve_preset
    from comfyui_h3.backend.pipelines.h3.geometry import RequestError

    kwargs = {"grow": None, "feather": None, field.replace("mask_", ""): value}
    with pytest.raises(RequestError, match=rf"mask {field[5:]} must be 0\.\.512 px, or -1 .*got {value}"):
        resolve_preset("removal", kwargs["grow"], kwargs["feather"], None, None)
    grow, feather, _, _ = resolve_preset("removal", -1, None, None, None)  # -1 / None: the preset's
    assert (grow, feather) == (PRESETS["removal"].grow, PRESETS["removal"].feather)
    assert resolve_preset("removal", 0, 512, None, None)[:2] == (0, 512)


def test_edit_node_mask_widgets_share_the_request_bound():
    from comfyui_h3.backend.pipelines.h3.editing import MAX_MASK_SHAPING
    from comfyui_h3.nodes.edit import H3Edit, edit_mask_shaping

    required = H3Edit.INPUT_TYPES()["required"]
    assert required["mask_grow"][1]["max"] == required["mask_feather"][1]["max"] == MAX_MASK_SHAPING
    mask = torch.zeros(1, 8, 8)
    assert edit_mask_shaping(mask, -1, -1) == (None, None)
    assert edit_mask_shaping(mask, -5, 3) == (-5, 3)  # passed on, for the request to refuse (not the preset's)


def test_one_steps_bound_for_nodes_generate_and_demo():
    from comfyui_h3.backend.pipelines.h3.geometry import RequestError
    from comfyui_h3.backend.pipelines.h3.request import MAX_STEPS, check_sampling
    from comfyui_h3.nodes.edit import H3Edit
    from comfyui_h3.nodes.extend import H3Extend
    from comfyui_h3.nodes.sample import H3Sample

    for node in (H3Sample, H3Edit, H3Extend):  # demo / run --steps are checked against these widgets
        steps = node.INPUT_TYPES()["required"]["steps"][1]
        assert (steps["min"], steps["max"]) == (1, MAX_STEPS), node.__name__
    check_sampling(MAX_STEPS, None, None, 0)  # generate takes it
    with pytest.raises(RequestError, match=f"between 1 and {MAX_STEPS}, got {MAX_STEPS + 1}"):
        check_sampling(MAX_STEPS + 1, None, None, 0)


def test_demo_steps_zero_is_not_taken_for_unset(tmp_path, capsys, monkeypatch):
    import comfyui_h3.cli as cli

    ran = []
    monkeypatch.setattr(cli, "_run_local", lambda prompt, out: ran.append(prompt) or [])
    monkeypatch.setattr("comfyui_h3.tiny_model.ensure_tiny_model", lambda: "tiny")
    monkeypatch.setattr(cli, "_write_demo_inputs", lambda folder: None)
    main(["demo", "--out-dir", str(tmp_path), "--steps", "0"])
    steps = [n["inputs"]["steps"] for p in ran for n in p.values() if n["class_type"] in ("H3_Sample", "H3_Edit")]
    assert steps and set(steps) == {0}  # handed to the nodes' check (which refuses 0), not silently dropped


@pytest.mark.parametrize("frames", ["10", "0", "361", "1000"])
def test_frames_out_of_range_quote_the_users_count(frames, capsys):
    rc = main(["generate", "--model", "/no/model", "--prompt", "x", "--frames", frames, "--out", "/tmp/never.mp4"])
    err = _error(capsys)
    assert rc == 2 and err.rstrip().endswith(f"got {frames}.") and "snap" not in err, err


@pytest.mark.parametrize("absolute", [False, True])
def test_model_naming_a_file_says_it_is_not_a_model_folder(tmp_path, capsys, monkeypatch, absolute):
    notes = tmp_path / "notes.txt"
    notes.write_text("not a model")
    monkeypatch.chdir(tmp_path)
    rc = main(["generate", "--model", str(notes) if absolute else "notes.txt", "--prompt", "x", "--out",
               str(tmp_path / "v.mp4")])
    err = _error(capsys)
    assert rc == 2 and f"{notes} is a file, not a MiniMax-H3 model folder" in err and "[]" not in err, err


def test_a_path_outside_empty_model_roots_names_no_empty_list():
    from comfyui_h3.comfy_services.models import UnsafePathError, resolve_h3_model

    with pytest.raises(UnsafePathError) as refused:
        resolve_h3_model("/somewhere/else", roots=[])
    assert "[]" not in str(refused.value) and "none are set" in str(refused.value)


def test_latents_get_the_mode_of_the_other_outputs(tmp_path):
    from safetensors.torch import save_file

    from comfyui_h3.cli_outputs import CliOutputs

    outputs = CliOutputs()
    latents, other = outputs.add(str(tmp_path / "l.safetensors")), outputs.add(str(tmp_path / "v.bin"))
    with outputs:
        outputs.write(latents, lambda tmp: save_file({"video": torch.zeros(2)}, tmp))
        outputs.write(other, lambda tmp: open(tmp, "wb").write(b"video"))
        outputs.publish()
    mode = lambda p: os.stat(p).st_mode & 0o777  # noqa: E731
    assert mode(latents) == mode(other), (oct(mode(latents)), oct(mode(other)))


def test_unreadable_media_is_a_sentence_without_errno(tmp_path):
    from comfyui_h3.backend.media.decode import decode_video

    notes = tmp_path / "notes.txt"
    notes.write_text("not a video")
    with pytest.raises(ValueError) as refused:
        decode_video(str(notes))
    text = str(refused.value)
    assert "[Errno" not in text and "notes.txt" in text and text.count(str(notes)) == 1, text


def _png_as_mp4(tmp_path):
    from PIL import Image

    path = tmp_path / "picture.mp4"
    Image.new("RGB", (64, 64), (200, 30, 30)).save(path, format="PNG")
    return path


def test_still_image_renamed_mp4_is_refused_by_every_reader(tmp_path):
    from comfyui_h3.backend.media.decode import decode_audio, decode_video, probe_video

    path = _png_as_mp4(tmp_path)
    for read in (decode_video, probe_video, decode_audio):
        with pytest.raises(ValueError, match="is a still image .*not a video"):
            read(str(path))


def test_upscale_refuses_a_still_image_as_edit_and_extend_do(tmp_path, capsys):
    path = _png_as_mp4(tmp_path)
    rc = main(["upscale", "--video", str(path), "--device", "cpu", "--out", str(tmp_path / "up.mp4")])
    err = _error(capsys)
    assert rc == 2 and "picture.mp4" in err and "still image" in err, err
    assert sorted(os.listdir(tmp_path)) == ["picture.mp4"]
