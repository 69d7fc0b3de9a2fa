"""H3 Model Loader: picks a MiniMax-H3 folder and how to run it; returns an engine handle (nothing loads yet:
the first H3 Sample that uses it starts the workers, and they persist across prompts)."""

from __future__ import annotations

from .. import comfy_services as services
from ..backend.attention.registry import available as attention_backends, descriptions as attention_descriptions
from ..backend.attention.vsa import spec as vsa_spec
from ..backend.attention.vsa_plan import VSASettings
from ..backend.engine_config import DTYPES, resolve_devices  # noqa: F401 - seedvr2_loader's too
from ..backend.pipelines.h3.family import h3_config
from ..backend.pipelines.h3.offload import RESIDENT_BLOCKS_CHOICES, RESIDENT_BLOCKS_HELP, parse_resident_blocks
from ..backend.runtime import WeightPolicy
from ..native_setup import COMPONENTS as NATIVE_COMPONENTS, NATIVE_ONLY, release_model_dir
from ..tiny_model import TINY_NAME, TINY_STUDENT_NAME, ensure_tiny_model, ensure_tiny_student
from ..types import H3EngineHandle
from .widgets import DEVICE_INPUT, GPUS_INPUT, attention_input, check_device, cuda_available

WEIGHT_FORMATS = {"bf16": "compute", "fp8": "fp8"}  # the 'weights' widget -> WeightPolicy.storage
VSA_DEFAULTS = VSASettings()  # the vsa widgets' defaults


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
                "dtype": (list(DTYPES), {
                    "default": "bfloat16",
                    "tooltip": "Compute precision of the transformer and text encoder. The checkpoint's float32 "
                               "layers stay float32. bfloat16 is what the model was released in."}),
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
                "adaln_cache": ("BOOLEAN", {
                    "default": False,
                    "tooltip": "Keep each step's AdaLN modulation tables on the GPU and the AdaLN projection weights "
                               "(~24 GB of the released model) in host memory; tables are rebuilt only when a "
                               "request brings new timesteps. Same output bit for bit. Falls back to the weights "
                               "for a request whose tables would be larger than them."}),
                "weights": (list(WEIGHT_FORMATS), {
                    "default": "bf16",
                    "tooltip": "bf16: the transformer's weights as released (in the dtype above). fp8: its blocks' "
                               "matmul weights quantised to FP8 (e4m3, one scale per output channel) at load and "
                               "run as FP8 matmuls with per-row activation scales on the FP8 tensor cores: the "
                               "DiT's resident weights drop by ~19 GB (its matmul weights halve), at a small loss "
                               "of precision. Needs an NVIDIA GPU with FP8 (RTX 40xx, L4/L40, H100/H200 or newer) "
                               "and dtype bfloat16."}),
                "resident_blocks": (list(RESIDENT_BLOCKS_CHOICES), {
                    "default": "all", "tooltip": RESIDENT_BLOCKS_HELP}),
                "vsa_topk": ("FLOAT", {
                    "default": VSA_DEFAULTS.topk, "min": 0.001, "max": 100000.0, "step": 0.001,
                    "tooltip": "With attention vsa: how many 4x4x4 video tiles each video tile attends besides the "
                               "prompt and condition rows. Below 1: a fraction of the clip's tiles (0.1 = 10%); "
                               "1 or more: a tile count. Ignored by the other attention kernels."}),
                "vsa_dense_steps": ("FLOAT", {
                    "default": VSA_DEFAULTS.dense_steps, "min": 0.0, "max": 1000.0, "step": 0.01,
                    "tooltip": "With attention vsa: steps run with dense attention before the sparse ones. Below "
                               "1: a fraction of the steps (0.25 = the first quarter); 1 or more: a step count. "
                               "Ignored by the other attention kernels."}),
                "student": (["none", TINY_STUDENT_NAME] + services.fasth3_adapter_files(), {
                    "default": "none",
                    "tooltip": "FastH3, FastVideo's 4-step student of MiniMax-H3: its adapter_model.safetensors "
                               "(vsa-datafree or dense-datafree) from a folder named after FastH3 under models/loras, "
                               "fused into the transformer at load. Then sample text-to-video with schedule fasth3 "
                               "and 4 steps. The vsa-datafree variant carries learned gates and needs attention vsa. "
                               "The tiny student goes with the tiny model."}),
                **native_file_inputs(),
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, device):
        # Names only `device`: ComfyUI skips its own combo check for the inputs named here, so model / dtype /
        # attention stay checked against their lists at queue time.
        return check_device(device)

    def load(self, model, device, dtype, attention, sp_degree=1, gpus="", executor="mp", ray_address="",
             adaln_cache=False, weights="bf16", resident_blocks="all", vsa_topk=None, vsa_dense_steps=None,
             student="none", **files):
        if weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got {weights!r}.")
        placement, resident = parse_resident_blocks(resident_blocks)
        if attention == "vsa":  # its settings travel in the backend's name ("vsa:topk=..,dense=..")
            attention = vsa_spec(VSA_DEFAULTS.topk if vsa_topk is None else vsa_topk,
                                 VSA_DEFAULTS.dense_steps if vsa_dense_steps is None else vsa_dense_steps)
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
        config = h3_config(model_dir=path, device=device, dtype=dtype, attention=attention, world_size=sp_degree,
                              executor=executor, ray_address=(ray_address or "").strip(), student=adapter,
                              files=files,
                              weights=WeightPolicy(adaln="cache" if adaln_cache else "direct",
                                                   storage=WEIGHT_FORMATS[weights],
                                                   placement=placement, resident_blocks=resident))
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
