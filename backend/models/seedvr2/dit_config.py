"""SeedVR2 DiT configurations: the released 3B (``models.dit_v2.nadit``) and 7B (``models.dit.nadit``), and tiny
look-alikes for tests and the generated tiny model files.

What the variant fixes (docs/SEEDVR2_PLAN.md section 1):
- "3b": layers ``0..mm_layers-1`` have separate video/text weights (``.vid.`` / ``.txt.``), later layers one shared
  set (``.all.``); SwiGLU MLP without bias; "mmrope3d" RoPE on video and text q/k; the last layer's mlp and ada are
  video-only (``last_layer_video_only``); an affine RMSNorm + ``vid_out_ada`` before the output projection
  (``out_norm``).
- "7b": separate streams in every layer (``mm_layers == layers``); GELU(tanh) MLP with bias; "pixel" RoPE on video
  q/k only, whose module dim is ``head_dim // 2`` (``rope_dim``); plain Linear output.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, Tuple

from .windows import WINDOW_COUNTS

VARIANTS = ("3b", "7b")


def swiglu_hidden(dim: int, expand_ratio: int = 4, multiple_of: int = 256) -> int:
    """The official SwiGLU width: 2/3 of dim * expand_ratio, rounded up to a multiple of 256 (2560 -> 6912)."""
    hidden = int(2 * dim * expand_ratio / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@dataclass(frozen=True)
class DiTConfig:
    variant: str  # "3b" | "7b"
    dim: int
    heads: int
    head_dim: int
    layers: int
    mm_layers: int  # layers with separate video/text weights (3B: the first 10; 7B: all)
    mlp: str  # "swiglu" (3B) | "gelu" (7B)
    mlp_hidden: int
    rope: str  # "mmrope3d" (3B) | "pixel" (7B)
    rope_dim: int  # the official RoPE module dim: 3B config rope_dim (128); 7B head_dim // 2
    txt_dim: int = 5120  # text embedding width (the released pos_emb is [58, 5120])
    vid_in_channels: int = 33  # [x_t 16 | condition 16 | mask 1]
    vid_out_channels: int = 16
    patch: Tuple[int, int, int] = (1, 2, 2)
    window_counts: Tuple[int, int, int] = WINDOW_COUNTS
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        object.__setattr__(self, "patch", tuple(int(p) for p in self.patch))
        object.__setattr__(self, "window_counts", tuple(int(c) for c in self.window_counts))
        expected = {"3b": ("swiglu", "mmrope3d"), "7b": ("gelu", "pixel")}
        if self.variant not in expected:
            raise ValueError(f"SeedVR2 DiT variant {self.variant!r} is unknown; expected one of {VARIANTS}")
        if (self.mlp, self.rope) != expected[self.variant]:
            raise ValueError(
                f"SeedVR2 {self.variant} DiT has mlp {expected[self.variant][0]!r} and rope "
                f"{expected[self.variant][1]!r}; got mlp {self.mlp!r}, rope {self.rope!r}"
            )
        if self.variant == "7b" and self.mm_layers != self.layers:
            raise ValueError(f"SeedVR2 7b DiT has separate streams in every layer: mm_layers {self.mm_layers} "
                             f"must equal layers {self.layers}")
        if self.variant == "7b" and self.rope_dim != self.head_dim // 2:
            raise ValueError(f"SeedVR2 7b pixel RoPE dim is head_dim // 2 = {self.head_dim // 2}; got {self.rope_dim}")
        if not 0 <= self.mm_layers <= self.layers or self.layers < 1:
            raise ValueError(f"SeedVR2 DiT needs layers >= 1 and 0 <= mm_layers <= layers; got {self.layers}, "
                             f"{self.mm_layers}")
        if self.patch[0] != 1 or min(self.patch) < 1 or len(self.patch) != 3:
            raise ValueError(f"SeedVR2 DiT patch {self.patch} must be (1, ph, pw) (no temporal patching)")
        # RoPE must leave room in a head: 3 axes of 2*((rope_dim // 3) // 2) channels each.
        if 6 * ((self.rope_dim // 3) // 2) > self.head_dim or (self.rope_dim // 3) // 2 < 1:
            raise ValueError(f"SeedVR2 DiT rope_dim {self.rope_dim} does not fit head_dim {self.head_dim}")

    # What the variant implies (not free settings: the official modules tie them to the variant).
    @property
    def out_norm(self) -> bool:
        """3B: RMSNorm(affine) + vid_out_ada before vid_out."""
        return self.variant == "3b"

    @property
    def last_layer_video_only(self) -> bool:
        """3B: the last layer's mlp_norm/mlp/ada act on video only (text unmodulated, not gated, no MLP)."""
        return self.variant == "3b"

    @property
    def inner_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def patch_in_dim(self) -> int:
        return self.vid_in_channels * self.patch[0] * self.patch[1] * self.patch[2]

    @property
    def patch_out_dim(self) -> int:
        return self.vid_out_channels * self.patch[0] * self.patch[1] * self.patch[2]

    def shared(self, layer: int) -> bool:
        """Whether `layer` has one weight set (``.all.``) for video and text."""
        return layer >= self.mm_layers

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["patch"], d["window_counts"] = list(self.patch), list(self.window_counts)
        return d

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "DiTConfig":
        return cls(**d)

    @classmethod
    def released(cls, variant: str) -> "DiTConfig":
        """The released checkpoints' configs (configs_3b/main.yaml, configs_7b/main.yaml)."""
        if variant == "3b":
            return cls(variant="3b", dim=2560, heads=20, head_dim=128, layers=32, mm_layers=10, mlp="swiglu",
                       mlp_hidden=swiglu_hidden(2560), rope="mmrope3d", rope_dim=128)
        if variant == "7b":
            return cls(variant="7b", dim=3072, heads=24, head_dim=128, layers=36, mm_layers=36, mlp="gelu",
                       mlp_hidden=4 * 3072, rope="pixel", rope_dim=64)
        raise ValueError(f"SeedVR2 DiT variant {variant!r} is unknown; expected one of {VARIANTS}")

    @classmethod
    def tiny(cls, variant: str, txt_dim: int = 5120) -> "DiTConfig":
        """Tiny look-alikes with every structural feature of the released ones: 3B-like has separate, shared and
        last-quirk layers and 5 mm-rope frequencies per axis; 7B-like has 4 pixel frequencies per axis and
        heads * head_dim (96) != dim (64)."""
        if variant == "3b":
            return cls(variant="3b", dim=64, heads=2, head_dim=32, layers=4, mm_layers=2, mlp="swiglu",
                       mlp_hidden=swiglu_hidden(64), rope="mmrope3d", rope_dim=32, txt_dim=txt_dim)
        if variant == "7b":
            return cls(variant="7b", dim=64, heads=2, head_dim=48, layers=4, mm_layers=4, mlp="gelu",
                       mlp_hidden=4 * 64, rope="pixel", rope_dim=24, txt_dim=txt_dim)
        raise ValueError(f"SeedVR2 DiT variant {variant!r} is unknown; expected one of {VARIANTS}")
