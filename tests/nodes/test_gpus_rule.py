"""The `gpus` list has one rule, in the engine config (issue 28 #7): the H3 and SeedVR2 loaders and the CLI's upscale
read it there, and a list that cannot be honoured (not ids, negative or repeated ids, GPUs named for a CPU engine or
for the ray executor) is refused in one sentence naming it, instead of being silently ignored."""

import pytest

from comfyui_h3.backend.engine_config import resolve_devices


@pytest.mark.parametrize("gpus", ["abc", "0,x", "-1", "0,-1", "1.5,2", "0,,1", "0;1"])
def test_gpu_lists_that_are_not_ids_are_refused_naming_them(gpus):
    with pytest.raises(ValueError, match=r"gpus must be 'all' or GPU ids .*got " + repr(gpus).replace(".", r"\.")):
        resolve_devices("cuda", 2, gpus)


def test_a_gpu_named_twice_is_refused():
    with pytest.raises(ValueError, match=r"gpus '1,1' names a GPU twice"):
        resolve_devices("cuda", 2, "1,1")


@pytest.mark.parametrize("degree,gpus", [(2, "0,1"), (1, "0"), (1, "abc"), (2, "all")])
def test_gpus_on_a_cpu_engine_are_refused(degree, gpus):
    with pytest.raises(ValueError, match=rf"gpus is '{gpus}' but the engine runs on the CPU"):
        resolve_devices("cpu", degree, gpus)


def test_valid_lists_still_resolve():
    assert resolve_devices("cuda", 2, " 3, 5 ") == ("cuda:3,5", 2)
    assert resolve_devices("cpu", 2, "") == ("cpu", 2)
    assert resolve_devices("cuda", 1, "") == ("cuda", 1)


def test_h3_loader_refuses_gpus_on_cpu_and_with_ray(tiny_h3_dir, monkeypatch):
    from comfyui_h3.nodes.loader import H3ModelLoader

    monkeypatch.setenv("COMFYUI_H3_MODELS", str(tiny_h3_dir.parent))
    with pytest.raises(ValueError, match="runs on the CPU"):
        H3ModelLoader().load(tiny_h3_dir.name, "cpu", "float32", "sdpa", 2, "0,1")
    with pytest.raises(ValueError, match="ray executor"):
        H3ModelLoader().load(tiny_h3_dir.name, "cuda", "float32", "sdpa", 2, "0,1", executor="ray")


def test_seedvr2_loader_refuses_gpus_on_cpu():
    from comfyui_h3.nodes.seedvr2_loader import H3SeedVR2Loader
    from comfyui_h3.tiny_model import TINY_SEEDVR2_NAME

    with pytest.raises(ValueError, match="gpus is 'abc' but the engine runs on the CPU"):
        H3SeedVR2Loader().load(TINY_SEEDVR2_NAME, "auto", "auto", "cpu", "float32", "sdpa", 1, "abc")


def test_cli_upscale_gpus_go_through_the_same_rule(tmp_path, capsys):
    from comfyui_h3.cli import main

    rc = main(["upscale", "--video", "/nonexistent.mp4", "--device", "cpu", "--sp-degree", "2", "--gpus", "0,1",
               "--out", str(tmp_path / "up.mp4")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "gpus is '0,1' but the engine runs on the CPU" in err, err
