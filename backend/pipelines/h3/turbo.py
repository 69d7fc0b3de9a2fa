"""The "turbo" schedule: a request sampled on the grid its engine's Turbo LoRA was distilled for (models/turbo_lora.py:
the LightX2V files' steps and shifts, from their released names). The grid itself is the default one (schedule.py);
what "turbo" adds is where its steps and shifts come from, and the refusal of a request that does not match them."""

from __future__ import annotations

from dataclasses import replace

from ...models.turbo_lora import KNOWN, turbo_contract
from .geometry import RequestError


def engine_contract(loras):
    """The Turbo contract of an engine's LoRAs (LoraChoice; their files' names), None when none is a Turbo file;
    RequestError when two disagree on the grid."""
    contracts = {c for c in (turbo_contract(choice.path) for choice in loras if choice.strength) if c is not None}
    grids = {(c.passes, c.video_shift, c.audio_shift) for c in contracts}
    if len(grids) > 1:
        raise RequestError(f"The engine's Turbo LoRAs were distilled for different grids "
                           f"({', '.join(sorted(c.name for c in contracts))}): keep one.")
    return min(contracts, key=lambda c: c.name) if contracts else None


def turbo_request(req, loras):
    """The request with its Turbo grid filled in: unset shifts (None / 0) are the file's; steps must be its."""
    contract = engine_contract(loras)
    if contract is None:
        raise RequestError("The turbo schedule takes its steps and shifts from a LightX2V Turbo LoRA on the engine "
                           f"(H3 LoRA; released names such as minimax_h3_{KNOWN[0]}_bf16.safetensors), and none of "
                           "this engine's LoRAs is one. For another few-step LoRA use schedule default with the "
                           "steps and shift its card gives.")
    if req.steps != contract.passes:
        raise RequestError(f"{contract.name} was distilled for {contract.passes} steps: set steps to "
                           f"{contract.passes} (got {req.steps}).")
    return replace(req, video_shift=req.video_shift or contract.video_shift,
                   audio_shift=req.audio_shift or contract.audio_shift)
