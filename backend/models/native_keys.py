"""Key maps between ComfyUI's native MiniMax-H3 single files and our diffusers-layout modules (docs/NATIVE_H3.md).

A map is built from the state-dict keys of OUR module (the one the folder loads into), so it always covers exactly
what that module holds; each `Link` ties one native tensor to one or more of our tensors and converts both ways
without loss (renames, concatenation, the per-head interleave of the VAE decoder's fused QKV, the SwiGLU halves the
native code reads in the other order). `extras` are native-only tensors (buffers the native modules keep in the
file); `dropped` are our keys with no native counterpart (the text encoder's final norm and LM head, which the
native conditioner file leaves out). The native names are those of ComfyUI's modules (comfy/ldm/minimax/model.py,
vae.py, audio_vae.py; comfy/text_encoders/minimax.py over qwen3vl.py), as ComfyUI loads them after stripping a
checkpoint prefix (e.g. "model.diffusion_model.").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import torch

__all__ = ["Link", "KeyMap", "transformer_map", "text_encoder_map", "video_vae_map", "audio_vae_map",
           "NATIVE_PREFIXES"]

#: Checkpoint prefixes ComfyUI strips before it loads a component (a file may carry one of them on every key).
NATIVE_PREFIXES = {
    "transformer": ("model.diffusion_model.",),
    "text_encoder": ("text_encoders.qwen3vl_32b.transformer.",),
    "vae": ("vae.", "first_stage_model."),
    "audio_vae": ("audio_vae.", "vae."),
}


@dataclass(frozen=True)
class Link:
    """One native tensor <-> `ours` (one or several tensors of our module).

    kind: "same" (renamed only); "cat" (our tensors concatenated on dim 0: q, k, v -> one QKV); "heads" (q, k, v
    interleaved per attention head: row = head * 3 * head_dim + part * head_dim + i, `heads` heads); "swap" (the two
    halves of dim 0 exchanged: SwiGLU [value | gate] <-> [gate | value])."""

    native: str
    ours: tuple[str, ...]
    kind: str = "same"
    heads: int = 0

    def to_native(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        if self.kind == "same":
            return tensors[0]
        if self.kind == "cat":
            return torch.cat(list(tensors), dim=0)
        if self.kind == "swap":
            return _swap_halves(tensors[0])
        rest = tensors[0].shape[1:]
        parts = [t.reshape(self.heads, -1, *rest) for t in tensors]
        return torch.stack(parts, dim=1).reshape(-1, *rest)

    def from_native(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        if self.kind == "same":
            return [tensor]
        if self.kind == "cat":
            return list(tensor.chunk(len(self.ours), dim=0))
        if self.kind == "swap":
            return [_swap_halves(tensor)]
        rest = tensor.shape[1:]
        parts = tensor.reshape(self.heads, len(self.ours), -1, *rest).unbind(1)
        return [p.reshape(-1, *rest).contiguous() for p in parts]

    def native_shape(self, shapes: Sequence[Sequence[int]]) -> tuple[int, ...]:
        if self.kind in ("same", "swap"):
            return tuple(shapes[0])
        return (sum(s[0] for s in shapes),) + tuple(shapes[0][1:])


def _swap_halves(t: torch.Tensor) -> torch.Tensor:
    half = t.shape[0] // 2
    return torch.cat([t[half:], t[:half]], dim=0)


@dataclass
class KeyMap:
    links: list[Link]
    extras: dict[str, str] = field(default_factory=dict)  # native-only key -> role
    optional: frozenset[str] = frozenset()  # extras a file may lack
    dropped: frozenset[str] = frozenset()  # our keys with no native tensor

    def native_keys(self) -> set[str]:
        return {link.native for link in self.links} | set(self.extras)

    def required_native_keys(self) -> set[str]:
        return self.native_keys() - set(self.optional)

    def native_shapes(self, ours: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        """native key -> the shape our module's tensors make it (extras are not included)."""
        return {link.native: link.native_shape([ours[k] for k in link.ours]) for link in self.links}

    def to_native(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {link.native: link.to_native([state[k] for k in link.ours]) for link in self.links}

    def from_native(self, get: Callable[[str], torch.Tensor]) -> Iterable[tuple[str, torch.Tensor]]:
        """(our key, tensor) for every link, reading native tensors with `get(native_key)` one at a time."""
        for link in self.links:
            for key, tensor in zip(link.ours, link.from_native(get(link.native))):
                yield key, tensor


def _build(our_keys: Iterable[str], renames: Sequence[tuple[str, str]],
           groups: Sequence[tuple[str, tuple[str, ...], str, str]], heads: int = 0,
           dropped: Callable[[str], bool] = lambda key: False) -> tuple[list[Link], frozenset[str]]:
    """Links for `our_keys`. `groups`: (our suffix pattern of the first member, the member names, the native
    replacement, kind); a group's members are joined into one native tensor. Every other key is renamed by
    `renames` (regex, replacement; applied in order)."""
    keys = list(our_keys)
    present = set(keys)
    links: list[Link] = []
    used: set[str] = set()
    drop = frozenset(k for k in keys if dropped(k))

    def rename(key: str) -> str:
        for pattern, repl in renames:
            key = re.sub(pattern, repl, key)
        return key

    for key in keys:  # groups first: their members may come before the key that names the group
        if key in drop:
            continue
        for pattern, members, native_suffix, kind in groups:
            match = re.search(pattern, key)
            if not match:
                continue
            stem, tail = key[:match.start()], key[match.end():]
            group = tuple(f"{stem}{m}{tail}" for m in members)
            missing = [k for k in group if k not in present]
            if missing:
                raise KeyError(f"{key}: the module lacks {missing[0]}, which the native layout joins with it")
            links.append(Link(rename(stem) + native_suffix + tail, group, kind, heads))
            used.update(group)
            break
    links.extend(Link(rename(key), (key,)) for key in keys if key not in used and key not in drop)
    natives = [link.native for link in links]
    if len(set(natives)) != len(natives):
        raise KeyError("two tensors of the module map to one native key")
    return links, drop


# -- the DiT (MiniMaxH3Model; ComfyUI strips "model.diffusion_model.") -------------------------------------------------

_DIT_RENAMES = (
    (r"^proj_in\.", "video_patch_proj."),
    (r"^audio_proj_in\.", "audio_patch_proj."),
    (r"^context_embedder\.", "condition_proj."),
    (r"^time_embedder\.linear_1\.", "time_embedder.proj_in."),
    (r"^time_embedder\.linear_2\.", "time_embedder.proj_out."),
    (r"^token_refiner\.refiner_blocks\.", "token_refiner.blocks."),
    (r"^transformer_blocks\.", "blocks."),
    (r"^norm_out\.norm\.", "final_layer.norm."),
    (r"^norm_out\.linear\.", "final_layer.adaln_proj.linear."),
    (r"^proj_out\.", "final_layer.video_out."),
    (r"^audio_proj_out\.", "final_layer.audio_out."),
    (r"\.attn\.norm_q\.", ".attn.q_norm."),
    (r"\.attn\.norm_k\.", ".attn.k_norm."),
    (r"\.attn\.to_out\.0\.", ".attn.out_proj."),
    (r"\.ff\.net\.2\.", ".mlp.fc2."),
)
_DIT_GROUPS = (
    # q, k, v -> one [3 * inner, hidden] projection, split q | k | v on its rows
    (r"\.attn\.to_q\.", (".attn.to_q.", ".attn.to_k.", ".attn.to_v."), ".attn.qkv_proj.", "cat"),
    # SwiGLU in: ours reads [value | gate], the native MLP [gate | value]
    (r"\.ff\.net\.0\.proj\.", (".ff.net.0.proj.",), ".mlp.fc1.", "swap"),
)


def transformer_map(our_keys: Iterable[str]) -> KeyMap:
    """Our H3Transformer's keys (= the diffusers partition's) <-> MiniMaxH3Model's. Native-only: `rope.inv_freq`
    (the rotary frequencies, a buffer the native module keeps in the file; ours computes them from the config)."""
    links, _ = _build(our_keys, _DIT_RENAMES, _DIT_GROUPS)
    return KeyMap(links, extras={"rope.inv_freq": "rope_inv_freq"})


# -- the text encoder (Qwen3-VL truncated to 50 layers, comfy/text_encoders/minimax.py) ------------------------------

_TEXT_RENAMES = ((r"^model\.language_model\.", "model."), (r"^model\.visual\.", "visual."))
_TEXT_LAYER = re.compile(r"^model\.language_model\.layers\.(\d+)\.")


def text_encoder_map(our_keys: Iterable[str], layers: int) -> KeyMap:
    """Qwen3VLForConditionalGeneration's keys <-> the native conditioner file's: the language model's layers
    0..layers-1 and embeddings under "model.", the vision tower under "visual."; no final norm and no LM head (H3
    reads the hidden state after layer `layers`, un-normalised)."""

    def dropped(key: str) -> bool:
        match = _TEXT_LAYER.match(key)
        return (key in ("model.language_model.norm.weight", "lm_head.weight")
                or (match is not None and int(match.group(1)) >= layers))

    links, drop = _build(our_keys, _TEXT_RENAMES, (), dropped=dropped)
    return KeyMap(links, dropped=drop)


# -- the video VAE (MiniMaxH3VideoVAE) ---------------------------------------------------------------------------------

_VAE_RENAMES = (
    (r"^encoder\.down_blocks\.(\d+)\.resnets\.", r"encoder.down.\1.block."),
    (r"^encoder\.down_blocks\.(\d+)\.downsamplers\.0\.", r"encoder.down.\1.downsample."),
    (r"\.conv_shortcut\.", ".nin_shortcut."),
    (r"^decoder\.proj_in\.", "decoder.x_embedder."),
    (r"\.attn\.to_out\.0\.", ".attn.to_out."),
    (r"\.ff\.net\.2\.", ".ff.w2."),
)
_VAE_GROUPS = (
    (r"\.attn\.to_q\.", (".attn.to_q.", ".attn.to_k.", ".attn.to_v."), ".attn.to_qkv.", "heads"),
    (r"\.ff\.net\.0\.proj\.", (".ff.net.0.proj.",), ".ff.w1.", "swap"),
)


def video_vae_map(our_keys: Iterable[str], decoder_heads: int) -> KeyMap:
    """AutoencoderKLMiniMaxH3's keys <-> MiniMaxH3VideoVAE's. The decoder's fused QKV is interleaved per head
    ([q_h | k_h | v_h] for each head h); its SwiGLU reads [gate | value]. Native-only buffers: `latents_mean` /
    `latents_std` (the normalisation, our config's) and the decoder's unused `mask_token`; a file may lack them (the
    native module then keeps the release's values)."""
    links, _ = _build(our_keys, _VAE_RENAMES, _VAE_GROUPS, heads=decoder_heads)
    extras = {"latents_mean": "latents_mean", "latents_std": "latents_std", "decoder.mask_token": "mask_token"}
    return KeyMap(links, extras=extras, optional=frozenset(extras))


# -- the audio VAE (MiniMaxH3AudioVAE) ---------------------------------------------------------------------------------

def audio_vae_map(our_keys: Iterable[str]) -> KeyMap:
    """AutoencoderKLMiniMaxH3Audio's keys, with its weight norms folded into plain `weight`s (the native file stores
    them folded) <-> MiniMaxH3AudioVAE's: the same names. Native-only buffers: `latents_mean` / `latents_std` (our
    config's), which the native module needs from the file."""
    links, _ = _build(our_keys, (), ())
    return KeyMap(links, extras={"latents_mean": "latents_mean", "latents_std": "latents_std"})
