"""A tiny H3 transformer and packed inputs for it, shared by the DiT-level tests (Ulysses ranks, FP8 GEMMs): random
weights at N(0, 0.3) so every path carries signal, and a layout with keyframe, audio and text rows."""

import torch

from comfyui_h3.backend.models.h3_transformer import H3Transformer, H3TransformerConfig
from comfyui_h3.backend.pipelines.h3.geometry import resolve_geometry
from comfyui_h3.backend.pipelines.h3.layout import build_layout
from comfyui_h3.backend.pipelines.h3.schedule import row_timestep_plan

CFG = dict(num_attention_heads=4, attention_head_dim=24, hidden_size=40, num_layers=2, num_refiner_layers=1,
           ffn_dim=64, text_dim=24, freq_dim=16, time_embed_hidden_dim=32, time_embed_dim=16, rope_freq_dim=4)


def dit_inputs():
    gen = torch.Generator().manual_seed(5)
    layout = build_layout(torch.tensor([1, 1, 0, 0, 1, 1, 1]), resolve_geometry(141, 64, 96), (1, 2, 2),
                          ("first",))
    ts, idx = row_timestep_plan(layout, 0.3, 0.55)
    return (torch.randn(1, layout.video_indices.numel(), 96, generator=gen),
            torch.randn(1, layout.audio_indices.numel(), 32, generator=gen),
            torch.randn(1, 7, CFG["text_dim"], generator=gen), ts, idx, layout.token_tags, layout.position_ids,
            layout.video_indices, layout.audio_indices, layout.text_indices)


def folder_state(folder) -> dict:
    """Every tensor of a model folder's safetensors files, as stored."""
    import os

    from safetensors.torch import load_file

    state = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            state.update(load_file(os.path.join(folder, name)))
    return state


def tiny_dit():
    torch.manual_seed(0)
    model = H3Transformer(H3TransformerConfig(**CFG), attention="math")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model.eval()


def config_inputs(cfg):
    from comfyui_h3.backend.pipelines.h3.geometry import resolve_geometry
    from comfyui_h3.backend.pipelines.h3.layout import build_layout
    from comfyui_h3.backend.pipelines.h3.schedule import row_timestep_plan

    gen = torch.Generator().manual_seed(7)
    layout = build_layout(torch.tensor([1, 1, 0, 0, 0, 1, 1, 1, 1]), resolve_geometry(124, 64, 96), (1, 2, 2))
    ts, idx = row_timestep_plan(layout, 0.37, 0.61)
    video = torch.randn(1, layout.video_indices.numel(), cfg.video_patch_dim, generator=gen)
    audio = torch.randn(1, layout.audio_indices.numel(), cfg.audio_in_channels, generator=gen)
    text = torch.randn(1, 9, cfg.text_dim, generator=gen)
    return (video, audio, text, ts, idx, layout.token_tags, layout.position_ids, layout.video_indices,
            layout.audio_indices, layout.text_indices)


def to_bf16(args):
    return tuple(a.bfloat16() if a.is_floating_point() and a.dim() == 3 else a for a in args)
