"""What an engine carrying the FastH3 student may run (models/fasth3.py fuses it into the transformer/ partition;
transformer_ref/, which ref2va and extension use, stays the base model's)."""

from __future__ import annotations

import os
from pathlib import Path

from ...models.checkpoint import meta_shapes
from ...models.fasth3 import Adapter, check_adapter, read_adapter
from ...models.h3_transformer import H3Transformer, H3TransformerConfig
from .geometry import RequestError

STUDENT_TASKS = ("t2va",)  # FastVideo's Preview v1 distils text-to-video-and-audio only (docs/FASTH3.md)


def check_student(components, req) -> None:
    """Refuse what would run the student off what it was distilled for: another task on its partition, or another
    schedule than its 4-step ladder."""
    if not components.carries_student(req.task):
        return
    if req.task not in STUDENT_TASKS:
        raise RequestError(f"This engine's transformer/ carries the FastH3 student, distilled for text-to-video only; "
                           f"{req.task} would run it off its training. Load the model without the student for "
                           f"{req.task}.")
    if getattr(req, "schedule", "default") != "fasth3":
        raise RequestError("This engine carries the FastH3 student: sample it on its own ladder (schedule fasth3, "
                           "steps 4).")


def check_adapter_for_folder(path: str | os.PathLike, transformer_dir: str | os.PathLike) -> Adapter:
    """read_adapter + check_adapter against a transformer folder's config (built on the meta device: no weights),
    for the checks made before any worker starts."""
    adapter = read_adapter(path)
    cfg = H3TransformerConfig.from_json(Path(transformer_dir) / "config.json")
    check_adapter(adapter, meta_shapes(lambda: H3Transformer(cfg)), cfg.num_layers)
    return adapter
