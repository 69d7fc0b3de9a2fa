"""SeedVR2 video VAE: our implementation of the official ``video_vae_v3`` causal 3D KL autoencoder ("s8_c16_t4":
3 <-> 16 channels, space /8, time /4 with 4n+1 frames <-> n+1 latent frames), weight-compatible with the released
``ema_vae_fp16.safetensors`` (state-dict keys and shapes are the official module's; no quant convs).

API (all under ``torch.no_grad``; computation in the parameters' dtype, inputs are cast to it):
    vae = SeedVR2VAE(VAEConfig.released())
    mean, logvar = vae.encode(video)   # video [B, 3, 4n+1, H, W] in [-1, 1] -> [B, 16, n+1, H // 8, W // 8]
    video = vae.decode(z)              # z [B, 16, T, h, w] (unscaled) -> [B, 3, 4T-3, 8h, 8w]
logvar is clamped to [-30, 20] as the official posterior does. The diffusion model sees
``(latent - LATENT_SHIFT) * LATENT_SCALE``; the official samples ``mean + exp(logvar / 2) * eps`` (the caller draws
eps), and decodes ``latent / LATENT_SCALE + LATENT_SHIFT``.

Memory (all exact, see vae_ops.py): the video is cut in time slices -- encode: frame 0 plus ``slice_frames``
frames, then ``slice_frames`` frames per slice (default 4, the official ``split_size``); decode: latent 0 plus
``slice_latents``, then ``slice_latents`` per slice (default 1) -- each causal conv carrying its leftover input frames
(2 per 3x3x3 conv) to the next slice, so sliced equals whole (fp32 rel <= 1e-6 on the tiny model) and activations
scale with one slice, not the clip. ``None`` runs the clip in one slice. Within a slice, convs run in row bands with
halos, each GroupNorm (+ SiLU) is applied band by band inside the conv that follows it (per-frame statistics taken
first), the mid-block attention runs one frame at a time (vae_ops.py says on which kernels), depth-to-space one
frame and row band at a time; ``chunk_bytes`` bounds each such piece (default 512 MiB). The decoded video is written into one
preallocated output (no concatenation copy).
Measured on one H200, released size, bf16, 2688x1536, the CUDA defaults (channels-last, norm kernels, frames written
in place, GEMM attention; docs/BENCHMARKS.md): encode of 21 frames 1.97 s, peak +34 GiB; decode of 6 latents 4.45 s,
+60 GiB (the carried frames of every conv at full resolution are about half of it); the 10-s x2 upscale's VAE
(241 frames) 74 s at a 78.3 GiB peak.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterator, Optional, Tuple

import torch
import torch.nn as nn

from .vae_config import VAEConfig
from .vae_layout import channels_last_for
from .vae_ops import DEFAULT_CHUNK_BYTES, CausalConv3d, CausalStream, FrameAttention, FrameGroupNorm, depth_to_space

LATENT_SCALE = 0.9152  # the official configs' vae.scaling_factor
LATENT_SHIFT = 0.0  # the official configs set no shifting_factor
LOGVAR_RANGE = (-30.0, 20.0)

_SAME = (1, 1, 1, 1)


def _conv3(cin: int, cout: int) -> CausalConv3d:
    """The official 3x3x3 causal conv (temporal padding 1 -> two copies of frame 0 in front; spatial padding 1)."""
    return CausalConv3d(cin, cout, 3, front=2, spatial_pad=_SAME)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, groups: int, eps: float):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin, eps=eps)
        self.conv1 = _conv3(cin, cout)
        self.norm2 = nn.GroupNorm(groups, cout, eps=eps)
        self.conv2 = _conv3(cout, cout)
        self.conv_shortcut = CausalConv3d(cin, cout, 1) if cin != cout else None

    def forward(self, x: torch.Tensor, stream: CausalStream) -> torch.Tensor:
        lim = stream.chunk_bytes
        h = self.conv1(x, stream, FrameGroupNorm(self.norm1, x, lim, silu=True))
        h = self.conv2(h, stream, FrameGroupNorm(self.norm2, h, lim, silu=True))
        skip = x if self.conv_shortcut is None else self.conv_shortcut(x, stream)
        return h.add_(skip)


class Downsample(nn.Module):
    """Stride-2 conv after a right/bottom zero row and column (the official ``Downsample3D``, padding 0); a temporal
    one is 3x3x3 with stride 2 in time too, after two copies of frame 0 (1 + 2n frames -> 1 + n)."""

    def __init__(self, channels: int, temporal: bool):
        super().__init__()
        kt = 3 if temporal else 1
        self.conv = CausalConv3d(channels, channels, (kt, 3, 3), stride=(2 if temporal else 1, 2, 2),
                                 front=2 if temporal else 0, spatial_pad=(0, 1, 0, 1))

    def forward(self, x: torch.Tensor, stream: CausalStream) -> torch.Tensor:
        return self.conv(x, stream)


class Upsample(nn.Module):
    """1x1x1 conv to 4*r*C channels, depth-to-space (x2 in h, w; x r in time, dropping frame 0's copy in the first
    slice: n + 1 -> 2n + 1), then a 3x3x3 causal conv (the official ``Upsample3D``)."""

    def __init__(self, channels: int, temporal: bool):
        super().__init__()
        self.time_ratio = 2 if temporal else 1
        self.conv = _conv3(channels, channels)
        self.upscale_conv = nn.Conv3d(channels, channels * 4 * self.time_ratio, 1)

    def forward(self, x: torch.Tensor, stream: CausalStream) -> torch.Tensor:
        drop = self.time_ratio > 1 and stream.first
        y = depth_to_space(self.upscale_conv, x, 2, self.time_ratio, drop, stream.chunk_bytes)
        return self.conv(y, stream)


class Block(nn.Module):
    """An encoder down block or decoder up block: resnets, then ``downsamplers`` / ``upsamplers`` (official names)."""

    def __init__(self, cin: int, cout: int, layers: int, cfg: VAEConfig, down: Optional[bool] = None,
                 up: Optional[bool] = None):
        super().__init__()
        self.resnets = nn.ModuleList(
            ResnetBlock(cin if i == 0 else cout, cout, cfg.norm_groups, cfg.eps) for i in range(layers)
        )
        self.downsamplers = None if down is None else nn.ModuleList([Downsample(cout, down)])
        self.upsamplers = None if up is None else nn.ModuleList([Upsample(cout, up)])

    def forward(self, x: torch.Tensor, stream: CausalStream) -> torch.Tensor:
        for resnet in self.resnets:
            x = resnet(x, stream)
        for sampler in self.downsamplers or self.upsamplers or ():
            x = sampler(x, stream)
        return x


class MidBlock(nn.Module):
    def __init__(self, channels: int, cfg: VAEConfig):
        super().__init__()
        self.attentions = nn.ModuleList([FrameAttention(channels, cfg.norm_groups, cfg.eps)])
        self.resnets = nn.ModuleList(ResnetBlock(channels, channels, cfg.norm_groups, cfg.eps) for _ in range(2))

    def forward(self, x: torch.Tensor, stream: CausalStream) -> torch.Tensor:
        x = self.resnets[0](x, stream)
        x = self.attentions[0](x, stream.chunk_bytes)
        return self.resnets[1](x, stream)


class Encoder(nn.Module):
    def __init__(self, cfg: VAEConfig):
        super().__init__()
        ch = cfg.block_channels
        self.conv_in = _conv3(cfg.in_channels, ch[0])
        self.down_blocks = nn.ModuleList(
            Block(ch[max(i - 1, 0)], ch[i], cfg.layers_per_block, cfg,
                  down=cfg.encoder_temporal_down(i) if i < len(ch) - 1 else None)
            for i in range(len(ch))
        )
        self.mid_block = MidBlock(ch[-1], cfg)
        self.conv_norm_out = nn.GroupNorm(cfg.norm_groups, ch[-1], eps=cfg.eps)
        self.conv_out = _conv3(ch[-1], 2 * cfg.latent_channels)
        # conv_in and the blocks before the first temporal down conv keep the frame rate: they may run in pieces
        self.full_rate = len(ch) - 1 - cfg.temporal_down_blocks

    def _full_rate_part(self, x: torch.Tensor, stream: CausalStream) -> torch.Tensor:
        x = self.conv_in(x, stream)
        for block in self.down_blocks[:self.full_rate]:
            x = block(x, stream)
        return x

    def forward(self, x: torch.Tensor, stream: CausalStream) -> torch.Tensor:
        x = in_pieces(self._full_rate_part, x, stream)
        for block in self.down_blocks[self.full_rate:]:
            x = block(x, stream)
        x = self.mid_block(x, stream)
        return self.conv_out(x, stream, FrameGroupNorm(self.conv_norm_out, x, stream.chunk_bytes, silu=True))


class Decoder(nn.Module):
    def __init__(self, cfg: VAEConfig):
        super().__init__()
        ch = tuple(reversed(cfg.block_channels))
        self.conv_in = _conv3(cfg.latent_channels, ch[0])
        self.up_blocks = nn.ModuleList(  # registered before mid_block, as in the official module (key order)
            Block(ch[max(i - 1, 0)], ch[i], cfg.layers_per_block + 1, cfg,
                  up=cfg.decoder_temporal_up(i) if i < len(ch) - 1 else None)
            for i in range(len(ch))
        )
        self.mid_block = MidBlock(ch[0], cfg)
        self.conv_norm_out = nn.GroupNorm(cfg.norm_groups, ch[-1], eps=cfg.eps)
        self.conv_out = _conv3(ch[-1], cfg.out_channels)
        # the up blocks after the last temporal upsampler and conv_out keep the frame rate: they may run in pieces
        self.full_rate = min(cfg.temporal_down_blocks, len(ch) - 1)

    def _full_rate_part(self, x: torch.Tensor, stream: CausalStream) -> torch.Tensor:
        for block in self.up_blocks[self.full_rate:]:
            x = block(x, stream)
        return self.conv_out(x, stream, FrameGroupNorm(self.conv_norm_out, x, stream.chunk_bytes, silu=True))

    def forward(self, z: torch.Tensor, stream: CausalStream) -> torch.Tensor:
        x = self.mid_block(self.conv_in(z, stream), stream)
        for block in self.up_blocks[:self.full_rate]:
            x = block(x, stream)
        return in_pieces(self._full_rate_part, x, stream)


def in_pieces(run: Callable[[torch.Tensor, CausalStream], torch.Tensor], x: torch.Tensor,
              stream: CausalStream) -> torch.Tensor:
    """run(x, stream) over pieces of ``stream.piece_frames`` frames of x (None: x whole), concatenated in time.
    `run` must keep the frame rate (no temporal up or down conv): its causal convs carry frames from piece to piece as
    from slice to slice, and its GroupNorms take per-frame statistics, so the pieces equal the whole slice (up to the
    convs' summation order) while its activations scale with one piece. Only the plain stream: a stream over ranks
    exchanges carried frames once per slice (backend/parallel/seedvr2_vae_shard.py)."""
    frames = stream.piece_frames
    total = x.shape[2]
    if not frames or total <= frames or type(stream) is not CausalStream:
        return run(x, stream)
    first, keep = stream.first, stream.keep
    out = []
    try:
        for a in range(0, total, frames):
            b = min(total, a + frames)
            stream.first, stream.keep = first and a == 0, keep or b < total
            out.append(run(x[:, :, a:b], stream))
    finally:
        stream.first, stream.keep = first, keep
    return torch.cat(out, 2)


def time_slices(total: int, step: Optional[int]) -> Iterator[Tuple[int, int]]:
    """[0, 1 + step), then runs of ``step`` (the official causal slicing: frame 0 travels with the first slice)."""
    if step is None or total <= 1 + step:
        yield 0, total
        return
    yield 0, 1 + step
    for a in range(1 + step, total, step):
        yield a, min(total, a + step)


def _run_sliced(module: nn.Module, x: torch.Tensor, step: Optional[int], chunk_bytes: int,
                check: Optional[Callable[[], None]] = None, piece_frames: Optional[int] = None
                ) -> Iterator[torch.Tensor]:
    stream = CausalStream(chunk_bytes)
    stream.piece_frames = piece_frames
    for a, b in time_slices(x.shape[2], step):
        if check is not None and a:  # between slices: a Stop (the callable raises) need not wait for the whole clip
            check()
        stream.keep = b < x.shape[2]
        yield module(x[:, :, a:b], stream)
        stream.first = False


def _check_piece_frames(piece_frames: Optional[int]) -> None:
    if piece_frames is not None and (isinstance(piece_frames, bool) or int(piece_frames) != piece_frames
                                     or piece_frames <= 0):
        raise ValueError(f"piece_frames must be a positive whole number of frames (or None), got {piece_frames!r}")


class SeedVR2VAE(nn.Module):
    """The SeedVR2 VAE (see the module docstring); ``encoder.*`` / ``decoder.*`` keys as the official checkpoint."""

    def __init__(self, config: Optional[VAEConfig] = None):
        super().__init__()
        self.config = config or VAEConfig.released()
        self.encoder = Encoder(self.config)
        self.decoder = Decoder(self.config)

    def _dtype(self) -> torch.dtype:
        return self.encoder.conv_in.weight.dtype

    def pass_format(self, x: torch.Tensor) -> torch.memory_format:
        """The memory format of a pass over x (vae_layout.py), the conv weights moved to it (once)."""
        cl = channels_last_for(x)
        fmt = torch.channels_last_3d if cl else torch.contiguous_format
        if getattr(self, "_weights_channels_last", False) != cl:
            self.to(memory_format=fmt)
            self._weights_channels_last = cl
        return fmt

    def _enter(self, x: torch.Tensor) -> torch.Tensor:
        """x in the parameters' dtype and in the pass's layout (vae_layout.py), the conv weights moved to it once."""
        fmt = self.pass_format(x)
        return x.to(self._dtype()).contiguous(memory_format=fmt)

    @torch.no_grad()
    def encode(self, video: torch.Tensor, slice_frames: Optional[int] = 4, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
               check: Optional[Callable[[], None]] = None, piece_frames: Optional[int] = None
               ) -> Tuple[torch.Tensor, torch.Tensor]:
        """video [B, 3, F, H, W] in [-1, 1], F = 1 + 4n -> (mean, logvar), each [B, 16, 1 + n, H // 8, W // 8],
        unscaled; logvar clamped to [-30, 20]. H, W not multiples of 8 are accepted as the official does (each
        stride-2 conv floors), so a caller that wants the whole frame back pads to multiples of 8 first.
        ``slice_frames``: frames per time slice after the first (a positive multiple of 4), None for one slice;
        ``check``: called between time slices (a Stop check that raises); ``piece_frames``: the full-rate layers
        (conv_in and the down blocks before the temporal ones) run each slice in pieces of this many frames (None:
        whole slices; in_pieces says why that is exact and what it saves)."""
        cfg = self.config
        tf = cfg.temporal_factor
        if video.ndim != 5 or video.shape[1] != cfg.in_channels or (video.shape[2] - 1) % tf:
            raise ValueError(f"SeedVR2 VAE encode needs video [B, {cfg.in_channels}, {tf}n+1 frames, H, W], "
                             f"got {tuple(video.shape)}")
        if slice_frames is not None and (slice_frames <= 0 or slice_frames % tf):
            raise ValueError(f"slice_frames must be a positive multiple of {tf} (or None), got {slice_frames}")
        x = self._enter(video)
        _check_piece_frames(piece_frames)
        moments = torch.cat(list(_run_sliced(self.encoder, x, slice_frames, chunk_bytes, check, piece_frames)),
                            2).contiguous()
        mean, logvar = moments.chunk(2, dim=1)
        return mean, logvar.clamp(*LOGVAR_RANGE)

    @torch.no_grad()
    def decode(self, z: torch.Tensor, slice_latents: Optional[int] = 1, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
               check: Optional[Callable[[], None]] = None, piece_frames: Optional[int] = None) -> torch.Tensor:
        """z [B, 16, T, h, w] (unscaled) -> video [B, 3, 4T - 3, 8h, 8w], about [-1, 1] (not clamped).
        ``slice_latents``: latent frames per time slice after the first (>= 1), None for one slice; ``check``: as
        encode's; ``piece_frames``: the full-rate layers (the up blocks after the temporal ones, conv_out) run each
        slice in pieces of this many frames (None: whole slices)."""
        cfg = self.config
        if z.ndim != 5 or z.shape[1] != cfg.latent_channels or z.shape[2] < 1:
            raise ValueError(f"SeedVR2 VAE decode needs latents [B, {cfg.latent_channels}, T >= 1, h, w], "
                             f"got {tuple(z.shape)}")
        if slice_latents is not None and slice_latents <= 0:
            raise ValueError(f"slice_latents must be positive (or None), got {slice_latents}")
        b, _, t, h, w = z.shape
        s, tf = cfg.spatial_factor, cfg.temporal_factor
        out = None
        pos = 0
        _check_piece_frames(piece_frames)
        for y in _run_sliced(self.decoder, self._enter(z), slice_latents, chunk_bytes, check, piece_frames):
            if out is None:
                out = y.new_empty(b, cfg.out_channels, tf * (t - 1) + 1, h * s, w * s)
            out[:, :, pos:pos + y.shape[2]] = y
            pos += y.shape[2]
        assert out is not None and pos == out.shape[2]
        return out


# Older diffusers names of the mid-block attention (the official loader renames them before a non-strict load).
_LEGACY_ATTENTION = {"query": "to_q", "key": "to_k", "value": "to_v", "proj_attn": "to_out.0"}


def rename_legacy_keys(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Map ``mid_block.attentions.0.{query,key,value,proj_attn}.*`` to the current ``to_q/to_k/to_v/to_out.0``."""
    out = {}
    for key, value in state_dict.items():
        parts = key.split(".")
        if len(parts) >= 2 and ".attentions." in key and parts[-2] in _LEGACY_ATTENTION:
            key = ".".join(parts[:-2] + [_LEGACY_ATTENTION[parts[-2]], parts[-1]])
        out[key] = value
    return out
