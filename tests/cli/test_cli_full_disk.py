"""A full disk, as the CLI meets it (issue 28 #16): an upscale streamed by the worker onto a full file system names
--out (not the hidden `..up.mp4.<hex>.part.<hex>.tmp` its writer used) and leaves nothing; the stream writer's
failure is raised between batches; a full cache folder names the folder the tiny model was being built in. Uses a
64 KB tmpfs (the `full_filesystem` fixture; skipped, saying why, where it cannot be mounted)."""

import os

import pytest
import torch



def _noise_mp4(path, frames, size):
    from comfyui_h3.backend.media.save import write_mp4

    noise = torch.randint(0, 256, (frames, size, size, 3), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(0))
    write_mp4(str(path), noise, 24.0, None, None)
    return path


@pytest.mark.slow
def test_upscale_onto_a_full_disk_names_the_out_path(full_filesystem, tmp_path, capsys):  # noqa: F811
    from comfyui_h3.cli import main

    video = _noise_mp4(tmp_path / "v.mp4", 20, 96)
    out = full_filesystem / "up.mp4"
    rc = main(["upscale", "--video", str(video), "--device", "cpu", "--batch-frames", "5", "--overlap", "0",
               "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and err == f"error: Could not write {out}: No space left on device.", err
    assert os.listdir(full_filesystem) == []  # no partial, no hidden temporary


def test_the_stream_writer_failure_is_raised_between_batches(full_filesystem):  # noqa: F811
    import time

    from comfyui_h3.backend.media.encode import reserve_path
    from comfyui_h3.backend.media.frame_sinks import FileSink

    path = reserve_path(str(full_filesystem / ".up.mp4.0000.part"))
    sink = FileSink(path, 256, 256, 24.0, "cpu", None, 18, "veryfast", {})
    saver, generator = sink.saver, torch.Generator().manual_seed(0)
    try:
        for _ in range(100):  # the encoder flushes in large blocks: the first failed one ends it
            sink.write(torch.randint(0, 256, (5, 256, 256, 3), dtype=torch.uint8, generator=generator))
            deadline = time.monotonic() + 60
            while saver._free.qsize() < saver._slot_count and time.monotonic() < deadline:
                time.sleep(0.02)  # every queued chunk consumed (or failed)
            if saver._error is not None:
                break
        assert saver._error is not None, "100 batches fit a 64 KB file system"
        with pytest.raises(RuntimeError, match="No space left on device"):
            sink.check()  # what the upscale asks before each batch: the failure now, before more work
    finally:
        sink.abort()
    assert os.listdir(full_filesystem) == []  # the writer removed its temporary and the reserved name


@pytest.mark.parametrize("which", ["ensure_tiny_model", "ensure_tiny_seedvr2"])
def test_a_full_cache_folder_is_named(full_filesystem, monkeypatch, which):  # noqa: F811
    import comfyui_h3.tiny_model as tiny

    monkeypatch.setenv("COMFYUI_H3_CACHE", str(full_filesystem))
    with pytest.raises(tiny.TinyCacheError) as refused:
        getattr(tiny, which)()
    text = str(refused.value)
    assert text.startswith("Cannot build the tiny ") and f"cache folder {full_filesystem}: No space left" in text
    assert "COMFYUI_H3_CACHE" in text and "\n" not in text
    assert os.listdir(full_filesystem) == []  # the staging folder is gone


def test_cli_with_a_full_cache_folder_is_one_line(full_filesystem, tmp_path, monkeypatch, capsys):  # noqa: F811
    from comfyui_h3.cli import main

    monkeypatch.setenv("COMFYUI_H3_CACHE", str(full_filesystem))
    video = _noise_mp4(tmp_path / "v.mp4", 5, 32)
    rc = main(["upscale", "--video", str(video), "--device", "cpu", "--out", str(tmp_path / "up.mp4")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and f"cache folder {full_filesystem}" in err, err


def test_a_workers_report_naming_a_temporary_names_the_output(tmp_path):
    """H3 Extend's worker streams into the staged output as upscale's does: its report names the hidden file."""
    import re

    from comfyui_h3.backend.engine import EngineError
    from comfyui_h3.cli_outputs import CliOutputs, OutputError

    outputs = CliOutputs()
    out = outputs.add(str(tmp_path / "long.mp4"))
    with outputs:
        staged = outputs.stage(out)
        hidden = os.path.join(tmp_path, f".{os.path.basename(staged)}.1a2b3c4d.tmp")
        with pytest.raises(OutputError, match=re.escape(f"Could not write {out}: Permission denied.")) as failed:
            with outputs.naming_failures():
                raise EngineError(f"Extending failed: RuntimeError: the video encoder failed: [Errno 13] Permission "
                                  f"denied: '{hidden}'")
        assert failed.value.errno == 13 and ".part" not in str(failed.value)
        with pytest.raises(EngineError, match="out of memory"):  # a report about something else stays as it is
            with outputs.naming_failures():
                raise EngineError("Extending failed: out of memory")
    assert os.listdir(tmp_path) == []
