"""The command line's failures are one line on stderr and exit code 2: a full disk, unreadable or unwritable files,
safetensors errors, a worker's report (its traceback only with COMFYUI_H3_DEBUG=1). The engine is replaced by a canned
result where a run is needed; a real full file system (a 64 KB tmpfs) is used where this machine lets us mount one."""

import errno
import os

import pytest
import torch

from cli_helpers import listing, run_generate


def _one_line(err: str) -> str:
    assert err.endswith("\n") and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("error: "), err
    return err


def test_safetensors_error_is_one_line(tmp_path, canned_engine, monkeypatch, capsys):  # noqa: F811
    from safetensors import SafetensorError

    import comfyui_h3.cli_generate as cli_generate

    def broken(path, result):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
                              "message: \"No space left on device\" })")

    monkeypatch.setattr(cli_generate, "save_latents_file", broken)
    rc = run_generate(tmp_path, "--out", tmp_path / "v.mp4", "--save-latents", tmp_path / "l.safetensors")
    err = _one_line(capsys.readouterr().err)
    assert rc == 2 and "l.safetensors: No space left on device" in err and listing(tmp_path) == []


def test_worker_report_is_one_line_and_its_traceback_is_opt_in(tmp_path, monkeypatch, capsys):
    import comfyui_h3.cli as cli
    import comfyui_h3.cli_generate as cli_generate
    from comfyui_h3.backend.engine import EngineError

    def failing(*args, **kwargs):
        raise EngineError("Loading the model failed: SafetensorError: transformer/x.safetensors is truncated\n"
                          "Traceback (most recent call last):\n  File \"worker.py\", line 1\n")

    monkeypatch.setattr(cli_generate, "run_on_engine", failing)
    monkeypatch.setattr(cli, "_resolve_model", lambda name: "/nonexistent-model")
    monkeypatch.delenv("COMFYUI_H3_DEBUG", raising=False)
    assert run_generate(tmp_path, "--out", tmp_path / "v.mp4") == 2
    err = _one_line(capsys.readouterr().err)
    assert "x.safetensors is truncated" in err and "COMFYUI_H3_DEBUG=1" in err
    monkeypatch.setenv("COMFYUI_H3_DEBUG", "1")
    assert run_generate(tmp_path, "--out", tmp_path / "v.mp4") == 2
    assert "worker.py" in capsys.readouterr().err


def test_multi_line_reports_keep_every_line_on_one(tmp_path, monkeypatch, capsys):
    import comfyui_h3.cli as cli
    import comfyui_h3.cli_generate as cli_generate

    def refused(*args, **kwargs):  # how server_client reports a 400 from ComfyUI
        raise RuntimeError("ComfyUI refused the workflow (Prompt outputs failed validation)\n"
                           "  node 2 (H3_Sample): Value 0 smaller than min of 1 (steps)\n"
                           "  node 3 (H3_SaveVideo): Value not in list (preset)")

    monkeypatch.setattr(cli_generate, "run_on_engine", refused)
    monkeypatch.setattr(cli, "_resolve_model", lambda name: "/nonexistent-model")
    assert run_generate(tmp_path, "--out", tmp_path / "v.mp4") == 2
    err = _one_line(capsys.readouterr().err)
    assert "failed validation); node 2 (H3_Sample): Value 0" in err and "node 3 (H3_SaveVideo)" in err


@pytest.mark.parametrize("exc", [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/out/tiny/model.safetensors"),
                                 PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/out/tiny")])
def test_make_tiny_write_errors_are_one_line(monkeypatch, capsys, exc):
    import comfyui_h3.backend.models.tiny as tiny
    from comfyui_h3.cli import main

    def failing(out, overwrite=False):
        raise exc

    monkeypatch.setattr(tiny, "make_tiny_h3", failing)
    assert main(["make-tiny", "--out", "/out/tiny"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"{exc.filename}: {exc.strerror}" in err


def test_bugs_keep_their_traceback(monkeypatch):
    import comfyui_h3.backend.models.tiny as tiny
    from comfyui_h3.cli import main

    monkeypatch.setattr(tiny, "make_tiny_h3", lambda out, overwrite=False: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        main(["make-tiny", "--out", "/out/tiny"])


def test_generate_onto_a_full_filesystem(full_filesystem, canned_engine, monkeypatch, capsys):  # noqa: F811
    from comfyui_h3.backend.pipelines.h3.request import H3Result

    noise = torch.randint(0, 256, (124, 32, 64, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    import comfyui_h3.cli_generate as cli_generate

    monkeypatch.setattr(cli_generate, "run_on_engine", lambda *a, **k: H3Result(
        task="t2va", video_latents=torch.randn(1, 24, 37, 2, 4), audio_latents=torch.randn(2, 32, 207),
        frames=noise, audio=torch.zeros(2, 165334), sample_rate=32000))
    rc = run_generate(full_filesystem, "--out", full_filesystem / "v.mp4", "--save-latents",
                   full_filesystem / "l.safetensors")
    err = _one_line(capsys.readouterr().err)
    assert rc == 2 and "No space left on device" in err
    assert listing(full_filesystem) == []  # nothing half-written, no temporaries
