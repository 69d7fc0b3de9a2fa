"""H3 LoRA: adds a LoRA to an H3 engine (engine in -> engine out, chainable like core's LoraLoaderModelOnly). The LoRA
merges into the DiT's weights when the engine loads (backend/models/lora.py); a chain of these nodes stacks them in
order. Nothing loads here: the file is checked (header and shapes against the model) when the handle is made."""

from __future__ import annotations

from dataclasses import replace

from .. import comfy_services as services
from ..backend.models.lora import lora_choice
from ..tiny_model import TINY_LORA_NAME, TINY_TURBO_LORA_NAME, ensure_tiny_lora
from ..types import H3EngineHandle

STRENGTH = {"default": 1.0, "min": -10.0, "max": 10.0, "step": 0.01}


class H3LoRA:
    CATEGORY = "H3"
    FUNCTION = "apply"
    RETURN_TYPES = ("H3_ENGINE",)
    RETURN_NAMES = ("engine",)
    OUTPUT_TOOLTIPS = ("The engine with this LoRA added (merged into the DiT when the engine loads; another LoRA or "
                       "strength on a later prompt is switched in place in seconds, without reloading the model).",)
    DESCRIPTION = ("Add a LoRA (diffusers / PEFT, kohya or ComfyUI-native keys, .safetensors) to an H3 engine. Chain "
                   "several to stack them.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "engine": ("H3_ENGINE", {"tooltip": "From H3 Model Loader, or another H3 LoRA."}),
                "lora_name": ([TINY_LORA_NAME, TINY_TURBO_LORA_NAME] + services.lora_files(), {
                    "tooltip": "A LoRA file from models/loras (extra_model_paths.yaml included). LightX2V's Turbo "
                               "files keep their released names there, so H3 Sample's turbo schedule knows their "
                               "steps and shifts. The built-in tiny LoRAs go with the tiny model."}),
                "strength": ("FLOAT", {**STRENGTH, "tooltip": "How much of the LoRA: W + strength x delta (0: none, "
                                                              "negative: its opposite)."}),
            },
            "optional": {
                "time_scale": ("FLOAT", {**STRENGTH, "tooltip": "The LoRA's edits to the time path (time "
                                                                "embedder, AdaLN projections), where the file has "
                                                                "them, at this fraction of strength (1: the same "
                                                                "strength; 0: left out)."}),
            },
        }

    def apply(self, engine, lora_name, strength, time_scale=1.0):
        if not isinstance(engine, H3EngineHandle):
            raise ValueError("H3 LoRA takes an H3 engine (H3 Model Loader's output).")
        if lora_name in (TINY_LORA_NAME, TINY_TURBO_LORA_NAME):
            path = str(ensure_tiny_lora(turbo=lora_name == TINY_TURBO_LORA_NAME))
        else:
            path = services.resolve_lora(lora_name)
        choice = lora_choice(path, strength, None if time_scale == 1 else strength * time_scale)
        options = engine.config.options
        config = replace(engine.config, options=replace(options, loras=tuple(options.loras) + (choice,)))
        config.validate()  # the file against the model's DiT (headers only), before any worker starts
        return (H3EngineHandle(config),)
