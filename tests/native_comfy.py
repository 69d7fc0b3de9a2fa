"""A ComfyUI with NestedTensor, for tests without one: comfy.nested_tensor's interface as the native-LATENT code uses
it, installed in sys.modules, with the node modules re-read (their LATENT inputs and outputs are decided when the pack
loads) and put back afterwards."""

from __future__ import annotations

import contextlib
import importlib
import sys
import types

NODE_MODULES = ("comfyui_h3.nodes.native_latent_io", "comfyui_h3.nodes.sample", "comfyui_h3.nodes.edit",
                "comfyui_h3.nodes.extend", "comfyui_h3.registration")


class FakeNestedTensor:
    """comfy.nested_tensor.NestedTensor as far as the conversion reads it (the real one: ComfyUI 0.8+)."""

    def __init__(self, tensors):
        self.tensors = list(tensors)
        self.is_nested = True


@contextlib.contextmanager
def nested_tensor_comfy(monkeypatch):
    """Yields the re-read modules (native_latent_io, sample, edit, extend, registration)."""
    comfy = types.ModuleType("comfy")
    nested = types.ModuleType("comfy.nested_tensor")
    nested.NestedTensor = FakeNestedTensor
    try:
        with monkeypatch.context() as m:
            m.setitem(sys.modules, "comfy", comfy)
            m.setitem(sys.modules, "comfy.nested_tensor", nested)
            yield [importlib.reload(importlib.import_module(n)) for n in NODE_MODULES]
    finally:
        for n in NODE_MODULES:
            importlib.reload(importlib.import_module(n))
