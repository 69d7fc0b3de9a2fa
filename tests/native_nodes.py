"""Stand-ins for the ComfyUI core nodes the native-interop workflows use (comfyui_h3/native_workflows.py), declared
as ComfyUI 0.30+ declares them (nodes.py; comfy_extras/nodes_minimax_h3.py, nodes_audio.py): input names and order,
types, widget ranges, outputs. They let the tests check those workflows structurally (links, types, widget values,
UI <-> API) where no such ComfyUI is at hand; the lane compares them with a real one's /object_info when it has them.
Combos that list model files accept the file names the workflows pick (the real list is the user's folder)."""

from __future__ import annotations

MAX_RESOLUTION = 16384
SAMPLERS = ["euler", "euler_ancestral", "heun", "dpmpp_2m", "res_multistep", "uni_pc"]
SCHEDULERS = ["simple", "normal", "karras", "exponential", "sgm_uniform", "beta"]
FILES = {
    "diffusion_models": ["minimax_h3_fl2va_bf16.safetensors", "minimax_h3_ref2va_bf16.safetensors"],
    "text_encoders": ["qwen3vl_32b_minimax_h3_bf16.safetensors"],
    "vae": ["minimax_h3_video_vae_fp16.safetensors", "minimax_h3_audio_vae_fp32.safetensors"],
}


def _node(name: str, required: dict, returns: tuple, optional: dict | None = None, output: bool = False):
    def run(self, **kwargs):
        raise RuntimeError(f"{name} is a stand-in: run this workflow in a ComfyUI with its native nodes.")

    spec = {"required": required, "optional": optional or {}}
    return type(name, (), {"INPUT_TYPES": classmethod(lambda cls: spec), "RETURN_TYPES": returns,
                           "FUNCTION": "run", "OUTPUT_NODE": output, "run": run, "NATIVE_STAND_IN": True})


NATIVE_NODE_CLASSES = {
    "UNETLoader": _node("UNETLoader", {
        "unet_name": (FILES["diffusion_models"],),
        "weight_dtype": (["default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"],)}, ("MODEL",)),
    "CLIPLoader": _node("CLIPLoader", {
        "clip_name": (FILES["text_encoders"],),
        "type": (["stable_diffusion", "wan", "qwen_image", "ltxv", "minimax"],)}, ("CLIP",),
        optional={"device": (["default", "cpu"],)}),
    "VAELoader": _node("VAELoader", {"vae_name": (FILES["vae"],)}, ("VAE",)),
    "MiniMaxH3ImageToVideo": _node("MiniMaxH3ImageToVideo", {
        "clip": ("CLIP",), "vae": ("VAE",), "prompt": ("STRING", {"multiline": True}),
        "width": ("INT", {"default": 1344, "min": 32, "max": MAX_RESOLUTION, "step": 32}),
        "height": ("INT", {"default": 768, "min": 32, "max": MAX_RESOLUTION, "step": 32}),
        "length": ("INT", {"default": 124, "min": 5, "max": 3600, "step": 17})}, ("CONDITIONING", "LATENT"),
        optional={"first_frame": ("IMAGE",), "last_frame": ("IMAGE",)}),
    "MiniMaxH3SigmaShift": _node("MiniMaxH3SigmaShift", {
        "model": ("MODEL",), "shift_video": ("FLOAT", {"default": 12.0, "min": 0.01, "max": 100.0, "step": 0.01}),
        "shift_audio": ("FLOAT", {"default": 3.0, "min": 0.01, "max": 100.0, "step": 0.01})}, ("MODEL",)),
    "KSampler": _node("KSampler", {
        "model": ("MODEL",),
        "seed": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF, "control_after_generate": True}),
        "steps": ("INT", {"default": 20, "min": 1, "max": 10000}),
        "cfg": ("FLOAT", {"default": 8.0, "min": 0.0, "max": 100.0, "step": 0.1}),
        "sampler_name": (SAMPLERS,), "scheduler": (SCHEDULERS,),
        "positive": ("CONDITIONING",), "negative": ("CONDITIONING",), "latent_image": ("LATENT",),
        "denoise": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01})}, ("LATENT",)),
    "VAEDecode": _node("VAEDecode", {"samples": ("LATENT",), "vae": ("VAE",)}, ("IMAGE",)),
    "VAEDecodeAudio": _node("VAEDecodeAudio", {"samples": ("LATENT",), "vae": ("VAE",)}, ("AUDIO",)),
}
