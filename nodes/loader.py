"""H3 Model Loader: picks a MiniMax-H3 folder and how to run it; returns an engine handle (nothing loads yet:
the first H3 Sample that uses it starts the workers, and they persist across prompts)."""

from __future__ import annotations

from .. import comfy_services as services
from ..backend.attention.registry import available as attention_backends, descriptions as attention_descriptions
from ..backend.engine_config import resolve_devices  # noqa: F401 - seedvr2_loader's too
from ..backend.pipelines.h3.family import engine_config
from ..backend.pipelines.h3.options import ENGINE
from ..native_setup import COMPONENTS as NATIVE_COMPONENTS, NATIVE_ONLY, release_model_dir
from ..tiny_model import TINY_NAME, TINY_STUDENT_NAME, ensure_tiny_model, ensure_tiny_student
from ..types import H3EngineHandle
from .widgets import DEVICE_INPUT, GPUS_INPUT, attention_input, check_device, cuda_available



class H3ModelLoader:
    CATEGORY = "H3"
    FUNCTION = "load"
    RETURN_TYPES = ("H3_ENGINE",)
    RETURN_NAMES = ("engine",)
    OUTPUT_TOOLTIPS = ("The engine handle for H3 Sample / Edit / Extend: the model loads (and its workers start) on "
                       "first use and stays loaded across prompts.",)
    DESCRIPTION = "Choose a MiniMax-H3 model folder and the device/precision to run it on."

    @classmethod
    def INPUT_TYPES(cls):
        services.register_h3_model_folder()
        return {
            "required": {
                "model": ([TINY_NAME] + services.h3_model_dirs() + [NATIVE_ONLY], {
                    "tooltip": "A MiniMax-H3 diffusers folder under models/minimax_h3, models/diffusers or "
                               "models/diffusion_models (extra_model_paths.yaml included). The built-in tiny model "
                               "runs anywhere but makes noise-like video. 'none': every part from ComfyUI's native "
                               "single files (the file inputs below), with the release's configs."}),
                **DEVICE_INPUT,
                **ENGINE.inputs("dtype"),
                **attention_input(attention_backends(), attention_descriptions()),
                "sp_degree": ("INT", {
                    "default": 1, "min": 1, "max": 8,
                    "tooltip": "Sequence-parallel ranks (Ulysses): one worker per GPU, each holding the model and "
                               "1/N of the sequence. Must divide the model's attention heads (56: 1, 2, 4, 7, 8). "
                               "On the CPU, N processes (for testing)."}),
                **GPUS_INPUT,
                "executor": (["mp", "ray"], {
                    "default": "mp",
                    "tooltip": "mp: one worker process per rank on this machine. ray: the ranks as Ray actors on a "
                               "Ray cluster (several machines); needs pip install \"comfyui-h3[ray]\"."}),
                "ray_address": ("STRING", {
                    "default": "",
                    "tooltip": "With executor ray: the cluster address (e.g. ray://head:10001 or auto); empty "
                               "starts a local Ray. Ray places the GPUs, so 'gpus' is ignored."}),
            },
            # Optional and appended: saved workflows keep their widget order.
            "optional": {
                **ENGINE.inputs("adaln_cache", "weights", "resident_blocks", "vsa_topk", "vsa_dense_steps"),
                "student": (["none", TINY_STUDENT_NAME] + services.fasth3_adapter_files(), {
                    "default": "none",
                    "tooltip": "FastH3, FastVideo's 4-step student of MiniMax-H3: its adapter_model.safetensors "
                               "(vsa-datafree or dense-datafree) from a folder named after FastH3 under models/loras, "
                               "fused into the transformer at load. Then sample text-to-video with schedule fasth3 "
                               "and 4 steps. The vsa-datafree variant carries learned gates and needs attention vsa. "
                               "The tiny student goes with the tiny model."}),
                **native_file_inputs(),
                **ENGINE.inputs("attention_precision"),
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, device):
        # Names only `device`: ComfyUI skips its own combo check for the inputs named here, so model / dtype /
        # attention stay checked against their lists at queue time.
        return check_device(device)

    def load(self, model, device, dtype, attention, sp_degree=1, gpus="", executor="mp", ray_address="",
             adaln_cache=False, weights="bf16", resident_blocks="all", vsa_topk=None, vsa_dense_steps=None,
             student="none", attention_precision=None, **files):
        files = {c: services.resolve_native_file(c, files[c]) for c in NATIVE_COMPONENTS
                 if files.get(c) not in (None, "", services.FROM_FOLDER)}
        if model == TINY_NAME:
            path = str(ensure_tiny_model())
        elif model == NATIVE_ONLY:
            path = release_model_dir()
        else:
            path = services.resolve_h3_model(model)
        adapter = None
        if student == TINY_STUDENT_NAME:
            adapter = str(ensure_tiny_student())
        elif student not in (None, "", "none"):
            adapter = services.resolve_fasth3_adapter(student)
        if device == "auto":
            device = "cuda" if cuda_available() else "cpu"
        if executor == "ray" and (gpus or "").strip():
            raise ValueError(f"gpus is {gpus!r} but the ray executor places each rank on a GPU of its own: leave gpus "
                             "empty.")
        device, sp_degree = resolve_devices(device, int(sp_degree), gpus)
        config = engine_config(path, attention=attention, vsa_topk=vsa_topk, vsa_dense_steps=vsa_dense_steps,
                               attention_precision=attention_precision,
                               adaln_cache=bool(adaln_cache), weights=weights, resident_blocks=resident_blocks,
                               device=device, dtype=dtype, world_size=sp_degree, executor=executor,
                               ray_address=(ray_address or "").strip(), student=adapter, files=files)
        config.validate()
        return (H3EngineHandle(config),)


NATIVE_FILE_HELP = {
    "transformer": "the DiT for text / keyframes to video and H3 Edit (the native fl2va file) from "
                   "models/diffusion_models",
    "transformer_ref": "the DiT for references and H3 Extend (the native ref2va file) from models/diffusion_models",
    "text_encoder": "the Qwen3-VL conditioner (qwen3vl_32b_minimax_h3_*) from models/text_encoders",
    "vae": "the video VAE (minimax_h3_video_vae_*) from models/vae",
    "audio_vae": "the audio VAE (minimax_h3_audio_vae_*) from models/vae",
}


def native_file_inputs() -> dict:
    """One combo per component: the model folder's weights, or a ComfyUI native single file (bf16 / fp16 / fp32, or
    FP8 scaled or not) from the folder ComfyUI keeps it in (extra_model_paths.yaml included)."""
    return {c: ([services.FROM_FOLDER] + services.native_files(c), {
        "default": services.FROM_FOLDER,
        "tooltip": f"Weights of {NATIVE_FILE_HELP[c]}: a ComfyUI single file (as the native MiniMax-H3 loaders "
                   f"read it), or '{services.FROM_FOLDER}'. Files and a folder mix freely: the folder (or, with "
                   f"model 'none', the release's configs) gives the configs and tokenizer."})
        for c in NATIVE_COMPONENTS}
