"""What an engine carrying the FastH3 student may run (models/fasth3.py fuses it into the transformer/ partition;
transformer_ref/, which ref2va and extension use, stays the base model's)."""

from __future__ import annotations

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
