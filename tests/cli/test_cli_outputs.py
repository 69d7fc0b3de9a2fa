"""The CLI's outputs are all or nothing: checked before any work, written to temporaries, published together; a
failed write (a full disk included) is a one-line error with exit code 2 and leaves nothing behind. The engine is
replaced by a canned result here (the real path is in test_cli.py), so these run in a second."""

import errno
import os

import pytest

from comfyui_h3.cli_outputs import CliOutputs, OutputError

from cli_helpers import listing, run_generate


def test_generate_publishes_video_and_latents_together(tmp_path, canned_engine, capsys):
    rc = run_generate(tmp_path, "--out", tmp_path / "v.mp4", "--save-latents", tmp_path / "l.safetensors")
    assert rc == 0
    assert listing(tmp_path) == ["l.safetensors", "v.mp4"]  # no temporaries left
    assert capsys.readouterr().out.split() == [str(tmp_path / "l.safetensors"), str(tmp_path / "v.mp4")]


def test_generate_that_fails_writing_the_video_leaves_no_latents(tmp_path, canned_engine, monkeypatch, capsys):
    import comfyui_h3.backend.media.save as save

    def full_disk(path, *args, **kwargs):
        with open(path, "wb") as handle:  # some bytes made it to the disk before it filled up
            handle.write(b"\0" * 1000)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(save, "write_mp4", full_disk)
    rc = run_generate(tmp_path, "--out", tmp_path / "v.mp4", "--save-latents", tmp_path / "l.safetensors")
    err = capsys.readouterr().err
    assert rc == 2
    assert listing(tmp_path) == []  # neither the (complete) latents nor the partial video, nor a temporary
    assert err.count("\n") == 1 and "No space left on device" in err and "v.mp4" in err and "Traceback" not in err


def test_generate_that_fails_writing_the_latents_leaves_no_video(tmp_path, canned_engine, monkeypatch, capsys):
    import comfyui_h3.cli_generate as cli_generate

    def broken(path, result):
        raise OSError(errno.EIO, os.strerror(errno.EIO), path)

    monkeypatch.setattr(cli_generate, "save_latents_file", broken)
    rc = run_generate(tmp_path, "--out", tmp_path / "v.mp4", "--save-latents", tmp_path / "l.safetensors")
    assert rc == 2 and listing(tmp_path) == []
    assert "l.safetensors" in capsys.readouterr().err


def test_publish_takes_back_what_it_published_when_a_later_name_is_taken(tmp_path):
    outputs = CliOutputs()
    first, second = outputs.add(tmp_path / "a.bin"), outputs.add(tmp_path / "b.bin")
    with outputs:
        outputs.write(first, lambda tmp: open(tmp, "wb").write(b"a"))
        outputs.write(second, lambda tmp: open(tmp, "wb").write(b"b"))
        (tmp_path / "b.bin").write_bytes(b"someone else's")  # appears while the command runs
        with pytest.raises(FileExistsError, match="b.bin"):
            outputs.publish()
    assert listing(tmp_path) == ["b.bin"] and (tmp_path / "b.bin").read_bytes() == b"someone else's"


def test_numbered_output_takes_the_first_free_number_at_the_end(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "h3_00001.mp4").write_bytes(b"old")
    outputs = CliOutputs()
    key = outputs.add_numbered(tmp_path / "out", "h3", ".mp4")
    with outputs:
        outputs.write(key, lambda tmp: open(tmp, "wb").write(b"new"))
        (path,) = outputs.publish()
    assert path == str(tmp_path / "out" / "h3_00002.mp4") and open(path, "rb").read() == b"new"
    assert listing(tmp_path / "out") == ["h3_00001.mp4", "h3_00002.mp4"]


def test_an_exception_while_writing_removes_every_temporary(tmp_path):
    outputs = CliOutputs()
    key = outputs.add(tmp_path / "a.bin")
    with pytest.raises(KeyError):
        with outputs:
            outputs.write(key, lambda tmp: open(tmp, "wb").write(b"a"))
            raise KeyError("stop")
    assert listing(tmp_path) == []


def test_write_errors_name_the_output(tmp_path):
    outputs = CliOutputs()
    key = outputs.add(tmp_path / "a.bin")

    def encoder_thread_failure(tmp):  # how StreamingVideoSaver reports its thread's OSError
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            raise RuntimeError(f"the video encoder failed: {exc}") from exc

    with outputs, pytest.raises(OutputError, match=r"Could not write .*a\.bin: No space left on device\.$"):
        outputs.write(key, encoder_thread_failure)
    assert listing(tmp_path) == []
