"""The published contracts of LightX2V's few-step "Turbo" LoRAs for MiniMax-H3 (lightx2v/Minimax-h3-Turbo on
Hugging Face; the training recipes in github.com/ModelTC/Minimax-H3-Turbo; the same table in vLLM-Omni's MiniMax-H3
recipe, which reads it from the file name as done here). Each file was distilled for one sampling grid: `passes`
model evaluations on H3's own grid (linspace(1, 0, passes + 1) shifted, schedule.py's "default"), a video shift
(6 for the 768p v1.x files, 12 for the 544p ones) and audio shift 3, Euler, no CFG, strength 1.

The Diffusers/PEFT copies (`..._bf16.safetensors`) carry no alpha tensors: the release applies them at
alpha / rank (alpha 8 or 128, rank 128), which `release_scale` gives; a file with its own alpha tensors or PEFT
header (the ComfyUI copies as ComfyUI's loader reads them) keeps its own. Assumed where it could not be checked
here: the ComfyUI copies' scale is in the file; ref2v 8-step 768p uses shift 6 (vLLM-Omni's table; one discussion
on the release page says 12).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

AUDIO_SHIFT = 3.0


@dataclass(frozen=True)
class TurboContract:
    name: str  # e.g. "fl2v_turbo_4step_v1.1_768p"
    passes: int  # model evaluations (steps) the file was distilled for
    video_shift: float
    alpha: float  # the release's alpha for its alpha-less PEFT copy (scale alpha / rank)
    audio_shift: float = AUDIO_SHIFT

    def record(self) -> dict:
        return {"turbo": self.name, "steps": self.passes, "video_shift": self.video_shift,
                "audio_shift": self.audio_shift}


# (task)_turbo_(N)step_v(version)[_768p] -> (video shift, alpha)
_CONTRACTS = {
    "fl2v_turbo_4step_v0.1": (12.0, 8.0),
    "fl2v_turbo_4step_v1.0_768p": (6.0, 128.0),
    "fl2v_turbo_4step_v1.1_768p": (6.0, 128.0),
    "fl2v_turbo_4step_v1.2_768p": (6.0, 8.0),
    "fl2v_turbo_8step_v1.0": (12.0, 8.0),
    "fl2v_turbo_8step_v1.0_768p": (6.0, 8.0),
    "ref2v_turbo_4step_v0.1": (12.0, 8.0),
    "ref2v_turbo_8step_v1.0_768p": (6.0, 8.0),
}
_NAME = re.compile(r"((?:fl2v|ref2v)_turbo_(\d+)step_v\d+\.\d+(?:_768p)?)")
KNOWN = tuple(sorted(_CONTRACTS))


def turbo_contract(path: str | Path) -> TurboContract | None:
    """The contract of a LightX2V Turbo file, recognised by its released name (`minimax_h3_<name>[_comfyui]_bf16`);
    None for any other file."""
    match = _NAME.search(Path(path).name.lower())
    if match is None or match.group(1) not in _CONTRACTS:
        return None
    shift, alpha = _CONTRACTS[match.group(1)]
    return TurboContract(match.group(1), int(match.group(2)), shift, alpha)


def release_scale(path: str | Path, rank: int) -> float | None:
    """alpha / rank for a Turbo file's Diffusers/PEFT copy that carries no alpha of its own; None for other files
    and for the ComfyUI copies (`_comfyui_` in the name: read at the file's own scale, as ComfyUI's loader does)."""
    if "comfyui" in Path(path).name.lower():
        return None
    contract = turbo_contract(path)
    return None if contract is None or rank <= 0 else contract.alpha / rank
