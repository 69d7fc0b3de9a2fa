"""Shipped workflows that combine our nodes with ComfyUI's own MiniMax-H3 nodes (docs/NATIVE_H3.md). They need a
ComfyUI that has those nodes (0.30.0 or newer, with the native LATENT's NestedTensor) and the Comfy-Org/MiniMax-H3
single files; elsewhere (an older ComfyUI, `python -m comfyui_h3 run` without --server) they cannot run, and the
tests check them structurally instead."""

from __future__ import annotations

#: The first ComfyUI release with the native MiniMax-H3 nodes (comfy_extras/nodes_minimax_h3.py).
MIN_COMFYUI = "0.30.0"

#: workflow name -> the ComfyUI core node types it uses.
NATIVE_WORKFLOWS = {
    "h3_native_sample_then_extend_upscale": ("UNETLoader", "CLIPLoader", "VAELoader", "MiniMaxH3ImageToVideo",
                                             "MiniMaxH3SigmaShift", "KSampler"),
    "h3_sample_then_native_decode": ("VAELoader", "VAEDecode", "VAEDecodeAudio"),
}


def needs_native_nodes(name: str) -> bool:
    return name in NATIVE_WORKFLOWS
