"""Engine setups built from ComfyUI's native MiniMax-H3 single files (docs/NATIVE_H3.md): the choice of "no diffusers
folder" and where its non-weight parts come from (the release's configs the package ships, plus a Qwen tokenizer)."""

from __future__ import annotations

from . import comfy_services as services
from .comfy_services.errors import H3ModelNotFound

#: The loader's model choice for a setup with no diffusers folder: every component from a native file.
NATIVE_ONLY = "none: the single files below (the release's configs)"
COMPONENTS = ("transformer", "transformer_ref", "text_encoder", "vae", "audio_vae")


def release_model_dir(tokenizer_dir: str | None = None) -> str:
    """A weightless folder with the release's configs and a Qwen tokenizer (`tokenizer_dir`, else the one of the
    ComfyUI this runs in), for setups whose weights all come from native single files."""
    from .backend.pipelines.h3.release_config import release_folder
    from .tiny_model import cache_dir

    tokenizer = tokenizer_dir or services.comfy_tokenizer_dir()
    if not tokenizer:
        raise H3ModelNotFound(
            "Native single files without a diffusers folder need a Qwen tokenizer for the text encoder: give "
            "--tokenizer DIR (a folder with vocab.json, merges.txt and tokenizer_config.json, e.g. ComfyUI's "
            "comfy/text_encoders/qwen25_tokenizer), or a MiniMax-H3 diffusers folder as the model.")
    return str(release_folder(tokenizer, cache_dir()))
