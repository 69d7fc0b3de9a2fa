"""SeedVR2 Model Loader: picks the SeedVR2 DiT and VAE files and how to run them; returns an engine handle (nothing
loads yet: the first SeedVR2 Upscale that uses it starts the workers, and they persist across prompts)."""

from __future__ import annotations

import os

from .. import comfy_services as services
from ..backend.attention.registry import dense_names as attention_backends, descriptions as attention_descriptions
from ..backend.engine_config import DTYPES
from ..backend.pipelines.seedvr2.family import DIT_VARIANTS, seedvr2_engine_config
from ..backend.pipelines.seedvr2.options import ENGINE
from ..tiny_model import TINY_SEEDVR2_NAME, ensure_tiny_seedvr2
from ..types import H3EngineHandle
from .loader import resolve_devices
from .widgets import DEVICE_INPUT, GPUS_INPUT, attention_input, check_device, cuda_available

AUTO_VAE = "auto"
SEEDVR2_ENGINE = "SEEDVR2_ENGINE"


class H3SeedVR2Loader:
    CATEGORY = "H3"
    FUNCTION = "load"
    RETURN_TYPES = (SEEDVR2_ENGINE,)
    RETURN_NAMES = ("engine",)
    OUTPUT_TOOLTIPS = ("The engine handle for SeedVR2 Upscale: the model loads (and its workers start) on first use "
                       "and stays loaded across prompts.",)
    DESCRIPTION = ("Choose a SeedVR2 DiT (3B or 7B, any precision) and VAE, and the device/precision to run them on. "
                   "Files come from models/SEEDVR2 (the folder the popular SeedVR2 pack uses), models/diffusion_models "
                   "and models/vae.")

    @classmethod
    def INPUT_TYPES(cls):
        services.register_seedvr2_model_folder()
        return {
            "required": {
                "model": ([TINY_SEEDVR2_NAME] + services.seedvr2_dit_files(), {
                    "tooltip": "The SeedVR2 DiT: seedvr2_ema_3b / 7b / 7b_sharp (fp16 or fp8) .safetensors from "
                               "models/SEEDVR2 or models/diffusion_models. Its text embedding pos_emb.pt is looked "
                               "for beside it and in models/SEEDVR2. The built-in tiny model runs anywhere but "
                               "makes noise."}),
                "vae": ([AUTO_VAE] + services.seedvr2_vae_files(), {
                    "default": AUTO_VAE,
                    "tooltip": "The SeedVR2 video VAE (ema_vae_fp16.safetensors) from models/SEEDVR2 or models/vae. "
                               "auto: the one beside the DiT, else the first found (the tiny model's own for the "
                               "tiny model)."}),
                "variant": (list(DIT_VARIANTS), {
                    "default": "auto",
                    "tooltip": "auto: the model the file holds (read from its header). 3b / 7b: refuse a file of "
                               "the other model with a clear error before anything loads."}),
                **DEVICE_INPUT,
                "dtype": (list(DTYPES), {
                    "default": "bfloat16",
                    "tooltip": "Compute precision of the DiT (fp8 files are cast to it at load). The VAE runs in "
                               "bfloat16, or float32 when this is float32."}),
                **attention_input(attention_backends(), attention_descriptions()),
                "sp_degree": ("INT", {
                    "default": 1, "min": 1, "max": 8,
                    "tooltip": "Window-parallel ranks: one worker per GPU, each holding the model and a share of "
                               "the attention windows (any count works). On the CPU, N processes (for testing)."}),
                **GPUS_INPUT,
            },
            # Optional and appended: saved workflows keep their widget order.
            "optional": ENGINE.node_inputs("optional"),
        }

    @classmethod
    def VALIDATE_INPUTS(cls, device):
        # Names only `device`: ComfyUI keeps its own list checks for model / vae / variant / dtype / attention. Whether
        # the chosen file holds the chosen variant needs two inputs; it is checked first thing in load() from the
        # file's header (config.validate), before any process starts or any weight is read.
        return check_device(device)

    def load(self, model, vae, variant, device, dtype, attention, sp_degree=1, gpus="", weights="bf16",
             resident_blocks="all"):
        dit_path, vae_path, text_path = resolve_seedvr2_files(model, vae)
        if device == "auto":
            device = "cuda" if cuda_available() else "cpu"
        device, sp_degree = resolve_devices(device, int(sp_degree), gpus)
        config = seedvr2_engine_config(dit_path, vae_path, text_path, variant=variant, dtype=dtype,
                                       vae_dtype="float32" if dtype == "float32" else "bfloat16", device=device,
                                       attention=attention, world_size=sp_degree, weights=weights,
                                       resident_blocks=resident_blocks)
        config.validate()  # the file's variant, the VAE's keys, devices: before anything starts
        return (H3EngineHandle(config),)


def resolve_seedvr2_files(model: str, vae: str = AUTO_VAE, allow_explicit_path: bool = False) -> tuple[str, str, str]:
    """(DiT, VAE, text embedding) paths for the loader's choices (the CLI passes allow_explicit_path=True): the tiny
    set is built on first use; `vae` "auto" is the VAE beside the DiT, else the first found."""
    if model in (TINY_SEEDVR2_NAME, "tiny"):
        from ..backend.models.seedvr2.tiny import DIT_FILE, TEXT_FILE, VAE_FILE

        folder = ensure_tiny_seedvr2()
        dit_path = os.path.join(folder, DIT_FILE.format(variant="3b"))
        vae_path = os.path.join(folder, VAE_FILE) if vae in (AUTO_VAE, "", None) else \
            services.resolve_seedvr2_file(vae, "vae", allow_explicit_path)
        return dit_path, vae_path, os.path.join(folder, TEXT_FILE)
    dit_path = services.resolve_seedvr2_file(model, "dit", allow_explicit_path)
    if vae in (AUTO_VAE, "", None):
        vae_path = services.find_seedvr2_vae(dit_path)
    else:
        vae_path = services.resolve_seedvr2_file(vae, "vae", allow_explicit_path)
    return dit_path, vae_path, services.find_seedvr2_text_embedding(dit_path)
