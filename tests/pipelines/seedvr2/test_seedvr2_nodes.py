"""SeedVR2 in ComfyUI: model discovery (folders, the text embedding's search, paths that would leave the model folders),
the loader's checks, and SeedVR2 Upscale end to end on the tiny models on the CPU (VIDEO in with its sound, IMAGE in,
one image, Stop between batches keeping the finished frames)."""

import os
import sys
import types

import pytest
import torch
from comfyui_lane import COMFYUI_DIR, NO_COMFYUI
from safetensors.torch import save_file

from comfyui_h3 import comfy_services as services
from comfyui_h3.comfy_services import SeedVR2FileNotFound, UnsafePathError

DIT_3B = {"vid_in.proj.weight": (4, 132), "vid_out_norm.weight": (4,), "blocks.0.attn.proj_qkv.vid.weight": (12, 4),
          "blocks.1.attn.proj_qkv.all.weight": (12, 4)}
DIT_7B = {"vid_in.proj.weight": (4, 132), "blocks.0.mlp.vid.proj_in.bias": (8,),
          "blocks.0.attn.proj_qkv.vid.weight": (12, 4)}
VAE = {"encoder.conv_in.weight": (2, 3, 3, 3, 3), "decoder.conv_out.weight": (3, 2, 3, 3, 3),
       "decoder.up_blocks.0.upsamplers.0.upscale_conv.weight": (4, 2, 1, 1, 1)}
IMAGE_VAE = {"encoder.conv_in.weight": (2, 3, 3, 3), "decoder.conv_out.weight": (3, 2, 3, 3)}  # a 2-D (image) VAE


def write(path, shapes):
    """A safetensors file whose header holds `shapes` (what discovery reads; the values are never looked at)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: torch.zeros(s) for k, s in shapes.items()}, str(path))
    return str(path)


@pytest.fixture
def fake_comfy(monkeypatch, tmp_path):
    """folder_paths as ComfyUI v0.8 has it (the surface discovery uses), under tmp_path/ComfyUI."""
    base = tmp_path / "ComfyUI"
    fp = types.ModuleType("folder_paths")
    fp.models_dir = str(base / "models")
    fp.folder_names_and_paths = {
        "diffusion_models": ([str(base / "models" / "unet"), str(base / "models" / "diffusion_models")], {".pt"}),
        "vae": ([str(base / "models" / "vae")], {".safetensors"}),
        "custom_nodes": ([str(base / "custom_nodes")], set()),
    }

    def add_model_folder_path(folder_name, full_folder_path, is_default=False):
        paths = fp.folder_names_and_paths.setdefault(folder_name, ([], set()))[0]
        if full_folder_path not in paths:
            paths.insert(0, full_folder_path) if is_default else paths.append(full_folder_path)

    fp.add_model_folder_path = add_model_folder_path
    fp.get_folder_paths = lambda name: fp.folder_names_and_paths[name][0][:]
    monkeypatch.setitem(sys.modules, "folder_paths", fp)
    monkeypatch.delenv("COMFYUI_H3_MODELS", raising=False)
    monkeypatch.delenv("COMFYUI_H3_COMFY", raising=False)
    return fp, base


def test_discovery_lists_seedvr2_files_by_their_headers(fake_comfy, tmp_path, monkeypatch):
    fp, base = fake_comfy
    models = base / "models"
    yaml_root = tmp_path / "yaml"  # extra_model_paths.yaml as the popular pack documents it (key `seedvr2`)
    fp.add_model_folder_path("seedvr2", str(yaml_root))
    write(models / "SEEDVR2" / "my_upscaler.safetensors", DIT_3B)  # in SEEDVR2 every file is looked at
    write(models / "SEEDVR2" / "ema_vae_fp16.safetensors", VAE)
    write(models / "SEEDVR2" / "other.safetensors", {"weight": (2, 2)})  # not SeedVR2: not listed
    write(models / "diffusion_models" / "seedvr2_ema_7b_fp16.safetensors", DIT_7B)
    write(models / "diffusion_models" / "video" / "SEEDVR2" / "sharp.safetensors", DIT_7B)  # a folder named SEEDVR2
    # In the shared folders only files named like SeedVR2 are opened: this one is not a safetensors file at all.
    (models / "diffusion_models" / "flux.safetensors").write_bytes(b"not a checkpoint")
    write(models / "vae" / "seedvr2_vae.safetensors", VAE)
    write(models / "vae" / "seedvr2_image_vae.safetensors", IMAGE_VAE)  # named like it, but a 2-D VAE
    write(yaml_root / "seedvr2_ema_3b_fp8_e4m3fn.safetensors", DIT_3B)
    env = tmp_path / "env"
    write(env / "seedvr2_env_3b.safetensors", DIT_3B)
    monkeypatch.setenv("COMFYUI_H3_MODELS", str(env))

    assert services.register_seedvr2_model_folder() == str(models / "SEEDVR2")
    services.register_seedvr2_model_folder()  # idempotent
    assert fp.folder_names_and_paths["SEEDVR2"][0] == [str(models / "SEEDVR2")]
    roots = [r for r, _ in services.seedvr2_roots("dit")]
    assert roots == [str(models / "SEEDVR2"), str(yaml_root), str(models / "unet"), str(models / "diffusion_models"),
                     str(env)]
    assert services.seedvr2_dit_files() == ["my_upscaler.safetensors", "seedvr2_ema_3b_fp8_e4m3fn.safetensors",
                                            "seedvr2_ema_7b_fp16.safetensors", "seedvr2_env_3b.safetensors",
                                            "video/SEEDVR2/sharp.safetensors"]
    assert services.seedvr2_vae_files() == ["ema_vae_fp16.safetensors", "seedvr2_vae.safetensors"]
    assert services.resolve_seedvr2_file("video/SEEDVR2/sharp.safetensors", "dit") == \
        str(models / "diffusion_models" / "video" / "SEEDVR2" / "sharp.safetensors")


def test_names_never_leave_the_model_folders(fake_comfy, tmp_path):
    fp, base = fake_comfy
    models = base / "models"
    dit = write(models / "SEEDVR2" / "seedvr2_ema_3b_fp16.safetensors", DIT_3B)
    write(models / "SEEDVR2" / "ema_vae_fp16.safetensors", VAE)
    outside = write(tmp_path / "elsewhere" / "seedvr2_ema_3b_fp16.safetensors", DIT_3B)
    with pytest.raises(UnsafePathError, match="'..'"):
        services.resolve_seedvr2_file("../../../elsewhere/seedvr2_ema_3b_fp16.safetensors", "dit")
    with pytest.raises(UnsafePathError, match="outside ComfyUI's model folders"):
        services.resolve_seedvr2_file(outside, "dit")
    assert services.resolve_seedvr2_file(outside, "dit", allow_explicit_path=True) == outside  # the CLI's own paths
    assert services.resolve_seedvr2_file(dit, "dit") == dit  # an absolute path inside a folder is fine
    with pytest.raises(SeedVR2FileNotFound, match="is a SeedVR2 VAE, not a DiT"):
        services.resolve_seedvr2_file("ema_vae_fp16.safetensors", "dit")
    with pytest.raises(SeedVR2FileNotFound, match=r"available: \['seedvr2_ema_3b_fp16.safetensors'\].*models/SEEDVR2"):
        services.resolve_seedvr2_file("seedvr2_ema_7b_fp16.safetensors", "dit")


def test_the_text_embedding_is_searched_beside_the_dit_then_seedvr2_then_the_popular_pack(fake_comfy, tmp_path):
    fp, base = fake_comfy
    models = base / "models"
    dit = write(models / "diffusion_models" / "seedvr2_ema_3b_fp16.safetensors", DIT_3B)
    with pytest.raises(SeedVR2FileNotFound, match=r"pos_emb\.pt was not found .*into ComfyUI/models/SEEDVR2/"):
        services.find_seedvr2_text_embedding(dit)
    pack = base / "custom_nodes" / "ComfyUI-SeedVR2_VideoUpscaler" / "pos_emb.pt"  # where that pack keeps it
    pack.parent.mkdir(parents=True)
    pack.write_bytes(b"x")
    assert services.find_seedvr2_text_embedding(dit) == str(pack)
    (models / "SEEDVR2").mkdir(parents=True)
    (models / "SEEDVR2" / "pos_emb.pt").write_bytes(b"x")
    assert services.find_seedvr2_text_embedding(dit) == str(models / "SEEDVR2" / "pos_emb.pt")
    (models / "diffusion_models" / "pos_emb.pt").write_bytes(b"x")
    assert services.find_seedvr2_text_embedding(dit) == str(models / "diffusion_models" / "pos_emb.pt")
    (models / "diffusion_models" / "pos_emb.safetensors").write_bytes(b"x")  # preferred to the pickle beside it
    assert services.find_seedvr2_text_embedding(dit) == str(models / "diffusion_models" / "pos_emb.safetensors")


def test_the_automatic_vae_is_the_one_beside_the_dit(fake_comfy):
    fp, base = fake_comfy
    models = base / "models"
    dit = write(models / "diffusion_models" / "seedvr2_ema_3b_fp16.safetensors", DIT_3B)
    with pytest.raises(SeedVR2FileNotFound, match="download ema_vae_fp16.safetensors"):
        services.find_seedvr2_vae(dit)
    write(models / "vae" / "seedvr2_vae_bf16.safetensors", VAE)
    assert services.find_seedvr2_vae(dit) == str(models / "vae" / "seedvr2_vae_bf16.safetensors")
    write(models / "SEEDVR2" / "zz.safetensors", VAE)
    write(models / "SEEDVR2" / "ema_vae_fp16.safetensors", VAE)  # the release's name first
    assert services.find_seedvr2_vae(dit) == str(models / "SEEDVR2" / "ema_vae_fp16.safetensors")
    write(models / "diffusion_models" / "seedvr2_vae_fp16.safetensors", VAE)
    assert services.find_seedvr2_vae(dit) == str(models / "diffusion_models" / "seedvr2_vae_fp16.safetensors")


def _truncated(path, shapes):
    data = open(write(path, shapes), "rb").read()
    path.write_bytes(data[: len(data) // 2])
    return str(path)


def test_a_truncated_dit_given_by_path_names_the_real_cause(tmp_path):
    bad = _truncated(tmp_path / "seedvr2_ema_3b_fp16.safetensors", DIT_3B)
    with pytest.raises(SeedVR2FileNotFound, match=r"seedvr2_ema_3b_fp16.safetensors.*damaged or incomplete") as info:
        services.resolve_seedvr2_file(bad, "dit", allow_explicit_path=True, roots=[])
    assert "holds no SeedVR2" not in str(info.value)


def test_a_damaged_vae_beside_the_dit_is_named_not_replaced_by_a_download_hint(fake_comfy):
    fp, base = fake_comfy
    models = base / "models"
    dit = write(models / "SEEDVR2" / "seedvr2_ema_3b_fp16.safetensors", DIT_3B)
    bad = _truncated(models / "SEEDVR2" / "ema_vae_fp16.safetensors", VAE)
    with pytest.raises(SeedVR2FileNotFound, match=r"ema_vae_fp16.safetensors.*damaged or incomplete") as info:
        services.find_seedvr2_vae(dit)
    assert bad in str(info.value) and "No SeedVR2 VAE" not in str(info.value)


def test_loader_refuses_a_file_of_the_other_variant_before_anything_starts(fake_comfy, monkeypatch):
    from comfyui_h3.backend.engine import resident_engines
    from comfyui_h3.backend.models.checkpoint import CheckpointError
    from comfyui_h3.nodes.seedvr2_loader import H3SeedVR2Loader

    fp, base = fake_comfy
    folder = base / "models" / "SEEDVR2"
    write(folder / "seedvr2_ema_3b_fp16.safetensors", DIT_3B)
    write(folder / "ema_vae_fp16.safetensors", VAE)
    (folder / "pos_emb.pt").write_bytes(b"x")
    spec = H3SeedVR2Loader.INPUT_TYPES()["required"]
    assert spec["model"][0][1:] == ["seedvr2_ema_3b_fp16.safetensors"] and spec["vae"][0] == [
        "auto", "ema_vae_fp16.safetensors"]
    before = resident_engines()
    with pytest.raises(CheckpointError, match=r"holds a SeedVR2 3B DiT, but the 7B model was chosen: pick a 7B file"):
        H3SeedVR2Loader().load("seedvr2_ema_3b_fp16.safetensors", "auto", "7b", "cpu", "bfloat16", "sdpa")
    with pytest.raises(SeedVR2FileNotFound, match="is a SeedVR2 DiT, not a VAE"):
        H3SeedVR2Loader().load("seedvr2_ema_3b_fp16.safetensors", "seedvr2_ema_3b_fp16.safetensors", "auto", "cpu",
                               "bfloat16", "sdpa")
    (handle,) = H3SeedVR2Loader().load("seedvr2_ema_3b_fp16.safetensors", "auto", "3b", "cpu", "float32", "sdpa", 2)
    o = handle.config.options
    assert (o.dit_path, o.vae_path, o.text_path) == (str(folder / "seedvr2_ema_3b_fp16.safetensors"),
                                                     str(folder / "ema_vae_fp16.safetensors"), str(folder / "pos_emb.pt"))
    assert handle.config.world_size == 2 and o.vae_dtype == "float32" and handle.config.compute_dtype == "float32"
    assert resident_engines() == before  # nothing started: the engine starts on the first upscale


@pytest.mark.parametrize("value,ok", [(0, True), (1, False), (5, True), (17, True), (4097, True), (4, False),
                                      (20, False), (-1, False), (4101, False), ("abc", False)])
def test_batch_frames_is_checked_when_the_prompt_is_queued(value, ok):
    from comfyui_h3.nodes.seedvr2_upscale import H3SeedVR2Upscale

    verdict = H3SeedVR2Upscale.VALIDATE_INPUTS(value)
    assert (verdict is True) == ok, verdict
    if value == 20:
        assert "use 17 or 21" in verdict
    if value == 1:  # the tooltip no longer lists it: the worker refused it for any video of more than one frame
        assert "use 0 for auto or 5" in verdict


@pytest.mark.parametrize("batch_frames", [0, 1, 5, 6, 17, 4097, 4101])
@pytest.mark.parametrize("frames", [1, 9])
def test_batch_frames_has_one_rule_for_the_node_and_the_worker(batch_frames, frames):
    """What the node's check accepts the worker's request takes, for any clip length (the node cannot know it), and
    what it refuses the request refuses with the same sentence (the CLI builds the same request)."""
    from comfyui_h3.backend.errors import RequestError
    from comfyui_h3.backend.pipelines.seedvr2.request import UpscaleRequest
    from comfyui_h3.nodes.seedvr2_upscale import H3SeedVR2Upscale as Node

    verdict = Node.VALIDATE_INPUTS(batch_frames)
    request = UpscaleRequest(torch.zeros(frames, 16, 16, 3, dtype=torch.uint8), batch_frames=batch_frames, overlap=0)
    if verdict is True:
        request.validate()
        from comfyui_h3.backend.pipelines.seedvr2.batches import plan_batches

        plan_batches(frames, batch_frames or 5, 0)  # the worker's plan takes it too
    else:
        with pytest.raises(RequestError) as refused:
            request.validate()
        assert str(refused.value).split(", got")[1] == verdict.split(", got")[1]


@pytest.mark.parametrize("name", ["scale", "short_side", "width", "height", "fps"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_refused_naming_the_input(name, bad):
    """ComfyUI's range checks let NaN / inf through; the node names the input instead of failing in int()."""
    from comfyui_h3.nodes.seedvr2_upscale import H3SeedVR2Upscale

    class Handle:
        class config:
            family = "seedvr2"

    values = dict(target="scale", scale=2.0, short_side=1080, width=1920, height=1080, batch_frames=0, overlap=8,
                  color_fix="wavelet", seed=0, edge="pad", fps=24.0)
    values[name] = bad
    if name in ("short_side",):
        values["target"] = "short side"
    with pytest.raises(ValueError, match=f"SeedVR2 Upscale's {name} must be a finite number, got {bad}") as err:
        H3SeedVR2Upscale().upscale(Handle(), images=torch.zeros(1, 16, 16, 3), **values)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_scale_is_a_request_error(bad):
    """The CLI's --scale nan reaches the request: refused there, naming it."""
    from comfyui_h3.backend.errors import RequestError
    from comfyui_h3.backend.pipelines.seedvr2.request import UpscaleRequest

    with pytest.raises(RequestError, match="scale must be a finite number"):
        UpscaleRequest(torch.zeros(1, 16, 16, 3, dtype=torch.uint8), scale=bad).validate()


def test_an_unknown_colour_fix_is_refused_naming_the_modes():
    """Not only at the request: the colour fix itself no longer falls through to lab for a name it does not know."""
    from comfyui_h3.backend.pipelines.seedvr2 import colorfix
    from comfyui_h3.backend.pipelines.seedvr2.options import COLOR_FIXES

    assert COLOR_FIXES is colorfix.METHODS  # one declaration: the node's choices, the request's check, the methods
    x = torch.rand(4, 3, 8, 8)
    with pytest.raises(ValueError, match="Colour fix 'sepia' is not one of wavelet, adain, lab, none"):
        colorfix._fix_frames(x, x, "sepia", False)
    with pytest.raises(ValueError, match="Colour fix 'Lab' is not one of"):
        colorfix.color_fix(x.permute(1, 0, 2, 3), x.permute(1, 0, 2, 3), "Lab")


def test_images_become_uint8_rgb_frames_and_nan_is_refused():
    from comfyui_h3.nodes.seedvr2_upscale import images_to_frames

    rgba = torch.rand(2, 20, 24, 4)
    frames = images_to_frames(rgba)
    assert frames.dtype == torch.uint8 and tuple(frames.shape) == (2, 20, 24, 3)
    # the quantisation's contract is the float64 product (frames.py); a float32 reference differs at near-ties
    assert torch.equal(frames, (rgba[..., :3].double() * 255).round().to(torch.uint8))
    grey = images_to_frames(torch.full((20, 24, 1), 0.5))  # one image without a batch dimension, one channel
    assert tuple(grey.shape) == (1, 20, 24, 3) and int(grey[0, 0, 0, 2]) == 128
    bad = torch.rand(1, 20, 24, 3)
    bad[0, 3, 4, 1] = float("nan")
    with pytest.raises(ValueError, match="images"):
        images_to_frames(bad)


def test_upscale_needs_one_input_and_a_seedvr2_engine():
    from comfyui_h3.backend.pipelines.h3.family import h3_config
    from comfyui_h3.nodes.seedvr2_upscale import H3SeedVR2Upscale
    from comfyui_h3.types import H3EngineHandle

    class Handle:
        class config:
            family = "seedvr2"

    node = H3SeedVR2Upscale()
    args = ("scale", 2.0, 1080, 1920, 1080, 0, 8, "wavelet", 0, "pad")
    with pytest.raises(ValueError, match="needs one input"):
        node.upscale(Handle(), *args)
    with pytest.raises(ValueError, match="needs one input"):
        node.upscale(Handle(), *args, video=object(), images=torch.zeros(1, 16, 16, 3))
    with pytest.raises(ValueError, match="SeedVR2 Model Loader"):
        node.upscale(H3EngineHandle(h3_config(model_dir="/nowhere")), *args, images=torch.zeros(1, 16, 16, 3))


# -- end to end on the tiny models (CPU) --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_seedvr2(tmp_path_factory):
    """The tiny SeedVR2 set as the loader builds it, in a cache of this module's own."""
    cache = tmp_path_factory.mktemp("cache")
    previous = os.environ.get("COMFYUI_H3_CACHE")
    os.environ["COMFYUI_H3_CACHE"] = str(cache)
    from comfyui_h3.tiny_model import ensure_tiny_seedvr2

    try:
        yield ensure_tiny_seedvr2()
    finally:
        if previous is None:
            os.environ.pop("COMFYUI_H3_CACHE", None)
        else:
            os.environ["COMFYUI_H3_CACHE"] = previous


@pytest.fixture
def tiny_engine(tiny_seedvr2, monkeypatch, tmp_path):
    from comfyui_h3.backend.engine import shutdown_all
    from comfyui_h3.nodes.seedvr2_loader import H3SeedVR2Loader
    from comfyui_h3.tiny_model import TINY_SEEDVR2_NAME

    monkeypatch.setenv("COMFYUI_H3_CACHE", str(tiny_seedvr2.parent))
    monkeypatch.setenv("COMFYUI_H3_TEMP", str(tmp_path / "temp"))
    monkeypatch.setenv("COMFYUI_H3_OUTPUT", str(tmp_path / "out"))
    assert H3SeedVR2Loader.INPUT_TYPES()["required"]["model"][0][0] == TINY_SEEDVR2_NAME
    (handle,) = H3SeedVR2Loader().load(TINY_SEEDVR2_NAME, "auto", "auto", "cpu", "float32", "sdpa")
    try:
        yield handle
    finally:
        shutdown_all()


def _clip(tmp_path, frames=9, height=32, width=48, seconds_of_sound=True):
    """A small MP4 with a soundtrack, as H3 Load Video gives it (file-backed)."""
    from comfyui_h3.backend.media.save import write_mp4
    from comfyui_h3.video_file import H3FileVideo

    g = torch.Generator().manual_seed(0)
    pictures = (torch.rand(frames, height, width, 3, generator=g) * 255).to(torch.uint8)
    wave = 0.1 * torch.sin(torch.arange(32000 * frames // 24) / 20.0).repeat(2, 1) if seconds_of_sound else None
    path = str(tmp_path / "source.mp4")
    write_mp4(path, pictures, 24, wave, 32000 if seconds_of_sound else None)
    return H3FileVideo(path)


def _decoded(path):
    import av

    with av.open(path) as container:
        video = container.streams.video[0]
        frames = sum(1 for _ in container.decode(video=0))
        return frames, (video.width, video.height), float(video.average_rate), len(container.streams.audio)


@pytest.mark.slow
def test_upscale_a_video_keeps_its_frames_rate_and_sound(tiny_engine, tmp_path):
    from comfyui_h3.nodes.save_video import H3SaveVideo
    from comfyui_h3.nodes.seedvr2_upscale import H3SeedVR2Upscale
    from comfyui_h3.video_file import H3FileVideo

    source = _clip(tmp_path)
    out = H3SeedVR2Upscale().upscale(tiny_engine, "scale", 2.0, 1080, 1920, 1080, 5, 2, "wavelet", 3, "pad",
                                     video=source)
    (video,) = out["result"]
    assert out["ui"]["text"][0].startswith("9 frames 48x32 -> 96x64 in 3 batches"), out["ui"]  # shown in the node
    assert isinstance(video, H3FileVideo) and video.path.startswith(str(tmp_path / "temp"))  # streamed by the worker
    assert video.get_dimensions() == (96, 64) and video.get_frame_count() == 9 and video.get_frame_rate() == 24
    assert torch.equal(video.audio, source.audio) and video.sample_rate == source.sample_rate  # the input's sound
    assert _decoded(video.path) == (9, (96, 64), 24.0, 1)
    saved = H3SaveVideo().save(video, "up/clip", 18, "veryfast")["ui"]["images"][0]
    assert _decoded(str(tmp_path / "out" / "up" / saved["filename"])) == (9, (96, 64), 24.0, 1)


def test_upscale_images_and_a_single_image_in_memory(tiny_engine, tmp_path):
    from comfyui_h3.nodes.seedvr2_upscale import H3SeedVR2Upscale
    from comfyui_h3.video_types import H3Video

    node = H3SeedVR2Upscale()
    images = torch.rand(5, 40, 56, 3)
    (video,) = node.upscale(tiny_engine, "short side", 2.0, 60, 1920, 1080, 0, 8, "adain", 0, "pad", images=images,
                            fps=12.0)["result"]
    assert type(video) is H3Video and video.frames.dtype == torch.uint8  # small: in memory, never encoded
    assert video.get_dimensions() == (84, 60) and video.get_frame_count() == 5 and video.get_frame_rate() == 12
    assert video.audio is None
    (one,) = node.upscale(tiny_engine, "width x height", 2.0, 60, 64, 48, 0, 8, "none", 0, "crop",
                          images=images[:1])["result"]
    assert tuple(one.frames.shape) == (1, 48, 64, 3)
    assert not os.path.exists(tmp_path / "temp") or not any(files for _, _, files in os.walk(tmp_path / "temp"))


def test_bad_settings_are_node_errors_before_any_work(tiny_engine):
    from comfyui_h3.nodes.seedvr2_upscale import H3SeedVR2Upscale

    images = torch.rand(9, 32, 32, 3)
    with pytest.raises(ValueError, match="Overlap 5 must be >= 0 and smaller than the batch"):
        H3SeedVR2Upscale().upscale(tiny_engine, "scale", 2.0, 60, 64, 48, 5, 5, "wavelet", 0, "pad", images=images)
    assert not tiny_engine.engine().started


def test_stop_between_batches_keeps_the_finished_frames(tiny_engine, tmp_path, monkeypatch):
    """Stop after the first batch: the worker ends at the next batch boundary, the frames already final are published
    as H3/upscale_partial_NNNNN.mp4 in the output folder, the temp file is gone, and the node raises the
    interrupt with a message naming the kept file."""
    from comfyui_h3.nodes import seedvr2_upscale
    from comfyui_h3.nodes.seedvr2_upscale import H3SeedVR2Upscale

    source = _clip(tmp_path, frames=17)
    seen = []

    def status(done, total):  # the node's "batch k/K" text, shown as each batch finishes
        seen.append((done, total))
        return f"batch {done}/{total}"

    monkeypatch.setattr(seedvr2_upscale, "batch_status", status)
    # ComfyUI's Stop: the interrupt flag the node polls (comfy_services.interrupt_requested), set once a batch is done.
    # The worker honours it at the next batch boundary (the one after the batch it may have started meanwhile).
    monkeypatch.setattr(services, "interrupt_requested", lambda: bool(seen))
    with pytest.raises(services.interrupt_exception_types()[-1],
                       match=r"after [123] of 4 batches; the \d+ finished frames are saved as H3/upscale_partial_00001"):
        H3SeedVR2Upscale().upscale(tiny_engine, "scale", 1.0, 60, 64, 48, 5, 1, "wavelet", 0, "pad", video=source)
    assert seen[0] == (1, 4) and len(seen) < 4
    kept = tmp_path / "out" / "H3" / "upscale_partial_00001.mp4"
    frames, size, rate, audio = _decoded(str(kept))
    assert 1 <= frames < 17 and size == (48, 32) and rate == 24.0 and audio == 1
    import av

    with av.open(str(kept)) as container:  # the sound under the kept frames, not the whole input's (17 frames)
        samples = sum(frame.samples for frame in container.decode(audio=0))
    assert abs(samples - frames * 32000 / 24) <= 2048, (samples, frames)  # AAC frames of 1024 samples, priming
    assert not any(files for _, _, files in os.walk(tmp_path / "temp"))


# -- the real ComfyUI lane ------------------------------------------------------------------------------------------------

@pytest.mark.skipif(not COMFYUI_DIR, reason=NO_COMFYUI)
def test_the_shipped_upscale_workflow_runs_in_comfyui(comfy):
    """ComfyUI lists both nodes (tooltips, the tiny model first) and runs the shipped Load Video -> SeedVR2 Upscale
    -> Save Video workflow through /prompt: the saved MP4 has the input's frames, rate and sound at twice its size."""
    from comfyui_lane import combo_choices, probe_mp4

    status, info = comfy.request("/object_info")
    assert status == 200 and {"H3_SeedVR2Loader", "H3_SeedVR2Upscale"} <= set(info), comfy.why("nodes missing")
    from comfyui_h3.tiny_model import TINY_SEEDVR2_NAME

    assert combo_choices(info["H3_SeedVR2Loader"]["input"]["required"]["model"])[0] == TINY_SEEDVR2_NAME
    assert info["H3_SeedVR2Upscale"]["output"] == ["VIDEO"]
    result = comfy.run_cli("seedvr2_upscale_video.api.json", comfy.root / "downloads", "2.frame_load_cap=9",
                           '1.device="cpu"', '1.dtype="float32"')
    files = [line for line in result.stdout.splitlines() if line.endswith(".mp4")]
    assert result.returncode == 0 and len(files) == 1, comfy.why(f"{result.stdout}\n{result.stderr}")
    assert probe_mp4(files[0]) == {"frames": 9, "fps": 24.0, "audio": 1, "size": (384, 192)}
