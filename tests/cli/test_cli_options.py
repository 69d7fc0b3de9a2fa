"""The CLI's options as documented: durations by the node's rule, outputs checked before any work, --help with
defaults, --device auto, extend's --prompt required, make-tiny's --overwrite. In-process and fast: each case fails
(or is checked) before a model is touched."""

import argparse
import os

import pytest

from comfyui_h3.cli import _parser, main, resolve_device


def _args(*argv):
    return _parser().parse_args(list(argv))


@pytest.mark.parametrize("seconds", [5.0, 5.5, 7.25, 10.0, 14.0, 14.375, 14.4, 14.5, 14.9, 15.0])
def test_cli_seconds_follow_the_node_rule(seconds):
    from comfyui_h3.cli_generate import build_request
    from comfyui_h3.nodes.sample import seconds_to_frames

    request = build_request(_args("generate", "--prompt", "x", "--seconds", str(seconds)))
    request.validate()  # 14.5 and 15 s were refused before
    assert request.num_frames == seconds_to_frames(seconds)
    assert request.num_frames >= round(seconds * 24) or request.num_frames == 345  # snapped up, or the longest


@pytest.mark.parametrize("frames,want", [(124, 124), (120, 124), (345, 345), (350, 345), (360, 345)])
def test_cli_frames_follow_the_same_rule(frames, want):
    from comfyui_h3.cli_generate import build_request

    request = build_request(_args("generate", "--prompt", "x", "--frames", str(frames)))
    request.validate()
    assert request.num_frames == want


@pytest.mark.parametrize("value", ["4.5", "15.5", "nan", "-1", "0"])
def test_durations_outside_the_range_are_clear_errors(value, capsys):
    rc = main(["generate", "--model", "/no/model", "--prompt", "x", "--seconds", value, "--out", "/tmp/never.mp4"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and ("5 to 15 s" in err or "finite" in err), err


def _unwritable(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_bytes(b"x")
    return {"under a file": str(blocker / "clip.mp4"), "under /proc": "/proc/h3-test/clip.mp4",
            "a folder": str(tmp_path)}


@pytest.mark.parametrize("case", ["under a file", "under /proc", "a folder"])
@pytest.mark.parametrize("option", ["--out", "--save-latents"])
def test_unwritable_outputs_fail_before_any_work(tmp_path, capsys, monkeypatch, case, option):
    import comfyui_h3.cli as cli

    monkeypatch.setattr(cli, "_resolve_model", lambda name: pytest.fail("the model was looked up first"))
    bad = _unwritable(tmp_path)[case]
    args = {"--out": str(tmp_path / "ok.mp4"), "--save-latents": str(tmp_path / "ok.safetensors")}
    args[option] = bad
    rc = main(["generate", "--prompt", "x", *[item for pair in args.items() for item in pair]])
    err = capsys.readouterr().err
    assert rc == 2 and bad in err and err.count("\n") == 1, err
    assert sorted(os.listdir(tmp_path)) == ["a_file"]


def test_extend_checks_its_outputs_before_decoding(tmp_path, capsys, monkeypatch):
    import comfyui_h3.cli_extend as cli_extend

    monkeypatch.setattr(cli_extend, "build_request", lambda *a: pytest.fail("decoded before checking --out"))
    (tmp_path / "a_file").write_bytes(b"x")
    rc = main(["extend", "--video", "missing.mp4", "--seconds", "2", "--prompt", "x",
               "--out", str(tmp_path / "a_file" / "long.mp4")])
    assert rc == 2 and "a_file is a file" in capsys.readouterr().err


def test_help_shows_defaults(capsys):
    for command in ("generate", "edit", "extend", "run", "make-tiny", "demo"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        if command in ("generate", "edit", "extend"):
            steps = "Default: 50, or 4 with the fasth3 schedule" if command == "generate" else "(default: 50)"
            assert steps in text and "(default: auto)" in text and "(default: tiny)" in text, text
            assert "(default: None)" not in text and "(default: False)" not in text
    with pytest.raises(SystemExit):
        main(["extend", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 277)" in text and "(default: continue)" in text
    usage = text.split("options:")[0]
    assert "--prompt PROMPT" in usage and "[--prompt PROMPT]" not in usage  # shown as required


def test_extend_requires_a_prompt(capsys):
    with pytest.raises(SystemExit) as info:
        main(["extend", "--video", "v.mp4", "--seconds", "2", "--out", "o.mp4"])
    assert info.value.code == 2 and "--prompt" in capsys.readouterr().err


def test_device_defaults_to_auto():
    import torch

    assert _args("generate", "--prompt", "x").device == "auto"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == "cpu"
    assert _args("generate", "--prompt", "x", "--device", "cuda:1").device == "cuda:1"
    with pytest.raises(SystemExit):
        _args("generate", "--prompt", "x", "--device", "gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            resolve_device("cuda")


def test_make_tiny_names_the_cli_flag(tmp_path, capsys):
    (tmp_path / "kept.txt").write_text("mine")
    assert main(["make-tiny", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--overwrite" in err and "overwrite=True" not in err
    assert (tmp_path / "kept.txt").read_text() == "mine"


def test_formatter_keeps_explicit_defaults_once():
    parser = argparse.ArgumentParser(formatter_class=_parser().formatter_class)
    parser.add_argument("--a", default=3, help="A number.")
    parser.add_argument("--b", default=3, help="A number (default 3).")
    parser.add_argument("--seed", default=0, help="Seed.")
    text = parser.format_help()
    assert "A number. (default: 3)" in text and "(default 3). (default" not in text and "(default: 0)" in text
