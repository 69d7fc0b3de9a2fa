"""Register a function as a torch custom op: opaque to torch.compile (Inductor calls it as it is, with the tensors'
shapes and strides taken from `fake`), plain Python in eager."""

from __future__ import annotations

import torch


def opaque_op(name: str, schema: str, impl, fake):
    """torch.ops.comfyui_h3.<name>. The package can be imported twice in one process under two names (ComfyUI loads
    it by path; tests also import comfyui_h3): the first registration serves both."""
    if not hasattr(torch.ops.comfyui_h3, name):
        op = torch.library.custom_op(f"comfyui_h3::{name}", impl, mutates_args=(), schema=schema)
        op.register_fake(fake)
    return getattr(torch.ops.comfyui_h3, name)
