"""The shipped UI workflows (example_workflows/<name>.json) as ComfyUI's template browser shows them: the order a
newcomer meets them in (first generation first: text to video, image to video, editing, extension, upscaling, the
interop with ComfyUI's own MiniMax-H3 nodes last), and each card's title and line, drawn on its thumbnail
(tools/make_template_thumbnails.py). ComfyUI 0.8 / 0.33 list a pack's templates as bare file names in glob order, and
frontends 1.35 / 1.58 title a pack's card with its file name (they read no title or description for custom-node
templates), so the order is given by reordering the server's listing (routes.register_template_order) and the title is
part of the picture."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple


class Card(NamedTuple):
    name: str  # example_workflows/<name>.json
    title: str
    line: str  # one sentence under the title


CARDS = (
    Card("h3_text_to_video", "Text to video", "A prompt becomes a video with its sound."),
    Card("h3_fasth3_text_to_video", "FastH3: text to video", "The 4-step student: a clip and its sound, fast."),
    Card("h3_turbo_text_to_video", "Turbo: text to video", "A Turbo LoRA's few steps: a clip and its sound."),
    Card("h3_first_last_frame", "First & last frame", "Two keyframes, and the video between them."),
    Card("h3_video_restyle", "Video restyle", "A clip re-made from itself at a strength: same motion."),
    Card("h3_object_removal", "Object removal", "Mask an object: it is gone, the rest is kept."),
    Card("h3_object_replacement", "Object replacement", "Mask an object and say what goes there."),
    Card("h3_inpainting", "Inpainting", "Paint a region and fill it to fit the scene."),
    Card("h3_object_removal_clicks", "Removal: click to track", "Click the object once; SAM2 masks every frame."),
    Card("h3_object_removal_text", "Removal: name to track", "Name the object; SAM3 masks it on every frame."),
    Card("h3_object_replacement_clicks", "Replace: box to track", "Box the object once; SAM2 follows it, H3 swaps it."),
    Card("h3_object_replacement_text", "Replace: name to track", "Name the object; SAM3 masks it, H3 swaps it."),
    Card("h3_extension", "Extension", "Continue a clip past 15 s, sound carried on."),
    Card("h3_generate_then_extend", "Generate, then extend", "A new clip, continued from its latents."),
    Card("h3_storyboard", "Storyboard film", "Shots cut or continued, one soundtrack."),
    Card("seedvr2_upscale_video", "Upscale a video", "SeedVR2 restores and upscales it, sound kept."),
    Card("h3_generate_then_upscale", "Generate, then upscale", "A new clip with its sound, upscaled by SeedVR2."),
    Card("h3_extend_then_upscale", "Extend, then upscale", "A clip continued, then upscaled by SeedVR2."),
    Card("h3_generate_then_refine", "Refine to 1080p", "Latents upscaled and denoised again by H3 itself."),
    Card("h3_refine_vs_upscale", "Two routes to 1080p", "One clip: H3 Refine and SeedVR2 side by side."),
    Card("h3_sample_then_native_decode", "H3, native decode", "H3 Sample's latents decoded by ComfyUI's H3 VAEs."),
    Card("h3_native_sample_then_extend_upscale", "Native H3, then extend",
         "ComfyUI's own H3 sampler, then H3 Extend + SeedVR2."),
)
BY_NAME = {card.name: card for card in CARDS}


def ordered(names) -> list[str]:
    """`names` in the cards' order; names without a card (a user's own workflow in the folder) after them, sorted."""
    rank = {card.name: k for k, card in enumerate(CARDS)}
    return sorted(names, key=lambda name: (rank.get(name, len(rank)), name))


def workflows_dir() -> Path:
    """The shipped API-format workflows: example_workflows/api/ (example_workflows/ holds the UI-format twins, which
    ComfyUI's template browser lists; the API ones sit a level down so it does not list them)."""
    here = Path(__file__).resolve().parent
    candidate = here.parent / "example_workflows" / "api"
    if candidate.is_dir():
        return candidate
    import comfyui_h3.workflows as packaged  # installed wheel: package data

    return Path(packaged.__path__[0]) / "api"
