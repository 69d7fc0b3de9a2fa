"""`run` of a shipped workflow from a fresh folder (issue 28 #20): the sample inputs the workflows name come from the
pack when the input folder lacks them, and temporaries (Mask Preview's MP4s, streamed results) go to a hidden folder
in the output folder that is removed at the end, however the run ends: nothing is left in the working directory."""

import os

import pytest

from comfyui_h3.cli import main


@pytest.fixture
def fresh_folder(tmp_path, monkeypatch):
    """An empty working directory, no input / temp folder set; COMFYUI_H3_OUTPUT restored after (main() sets it)."""
    work = tmp_path / "fresh"
    work.mkdir()
    monkeypatch.chdir(work)
    for name in ("COMFYUI_H3_INPUT", "COMFYUI_H3_TEMP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COMFYUI_H3_OUTPUT", str(tmp_path / "unused"))
    return work


def _tree(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files)


def test_sample_inputs_resolve_from_the_pack_when_the_input_folder_lacks_them(tmp_path, monkeypatch):
    from comfyui_h3.comfy_services import resolve_input_path
    from comfyui_h3.install_samples import SAMPLE_DIR, SAMPLE_FILES

    monkeypatch.setenv("COMFYUI_H3_INPUT", str(tmp_path / "input"))
    for name in SAMPLE_FILES:
        assert resolve_input_path(name) == os.path.join(SAMPLE_DIR, name)
    with pytest.raises(FileNotFoundError):  # only the pack's own samples have a fallback
        resolve_input_path("someone_elses.mp4")
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / SAMPLE_FILES[0]).write_bytes(b"the user's own")
    assert resolve_input_path(SAMPLE_FILES[0]) == str(tmp_path / "input" / SAMPLE_FILES[0])  # theirs wins


@pytest.mark.slow
def test_shipped_workflow_runs_from_a_fresh_folder_and_leaves_only_its_outputs(fresh_folder, tmp_path, capsys):
    from comfyui_h3.templates import workflows_dir

    out = tmp_path / "out"
    rc = main(["run", str(workflows_dir() / "h3_object_removal.api.json"), "--out-dir", str(out), "--set",
               "5.steps=1"])  # H3 Load Video of the sample clip, Mask Preview (a temp MP4), H3 Edit, Save Video
    err = capsys.readouterr().err
    assert rc == 0, err
    assert os.listdir(fresh_folder) == []  # no ./input, ./temp or ./output
    made = _tree(out)
    assert made == ["H3/object_removal_00001.mp4", "H3/object_removal_00001.mp4.manifest.json"], made
    assert not [name for name in os.listdir(out) if name.startswith(".")]  # the temp folder is gone
    from comfyui_h3.backend.engine import _ENGINES

    assert not [e.config for e in list(_ENGINES.values()) if e.started]  # the command's workers ended with it


def test_the_temp_folder_is_removed_when_the_workflow_fails(fresh_folder, tmp_path, monkeypatch, capsys):
    import comfyui_h3.workflow_runner as runner
    from comfyui_h3 import comfy_services as services
    from comfyui_h3.templates import workflows_dir

    seen = []

    def failing(prompt, on_node=None, should_stop=None):
        folder = services.temp_directory()
        seen.append(folder)
        os.makedirs(folder, exist_ok=True)
        open(os.path.join(folder, "h3_mask_preview_00001.mp4"), "wb").write(b"partial")
        raise RuntimeError("a node failed")

    monkeypatch.setattr(runner, "execute", failing)
    out = tmp_path / "out"
    rc = main(["run", str(workflows_dir() / "h3_object_removal.api.json"), "--out-dir", str(out)])
    assert rc == 2 and "a node failed" in capsys.readouterr().err
    assert seen and os.path.dirname(seen[0]) == str(out) and not os.path.exists(seen[0])
    assert os.listdir(fresh_folder) == [] and _tree(out) == []
    assert "COMFYUI_H3_TEMP" not in os.environ


def test_a_temp_folder_the_user_names_is_kept(fresh_folder, tmp_path, monkeypatch, capsys):
    import comfyui_h3.workflow_runner as runner
    from comfyui_h3 import comfy_services as services
    from comfyui_h3.templates import workflows_dir

    keep = tmp_path / "keep"
    monkeypatch.setenv("COMFYUI_H3_TEMP", str(keep))
    monkeypatch.setattr(runner, "execute", lambda prompt, on_node=None, should_stop=None: (
        os.makedirs(services.temp_directory(), exist_ok=True),
        open(os.path.join(services.temp_directory(), "preview.mp4"), "wb").write(b"x")) and {})
    assert main(["run", str(workflows_dir() / "h3_object_removal.api.json"), "--out-dir", str(tmp_path / "o")]) == 0
    assert _tree(keep) == ["preview.mp4"]
