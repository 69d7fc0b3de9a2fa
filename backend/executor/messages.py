"""Messages between the engine (driver) and its worker processes. Plain picklable dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Job:
    job_id: int
    kind: str  # the engine config's model family (the worker runs its pipeline)
    request: Any
    live: dict | None = None  # the engine config's live options (families.py), set on the pipeline before the run


@dataclass
class Shutdown:
    pass


@dataclass
class Ready:
    rank: int
    load_s: float
    device: str
    preloaded: bool = False  # forked from the forkserver with worker_preload's imports already done


@dataclass
class Progress:
    job_id: int
    done: int
    total: int
    preview: Any = None  # a live preview of this step (uint8 numpy [H, W, 3], ~50 KB), when the request asked for one


@dataclass
class Done:
    job_id: int
    result: Any


@dataclass
class Failed:
    job_id: int | None  # None: failed while starting/loading
    kind: str  # "error" | "oom" | "cancelled" | "request" | "reload" (live options not taken in place)
    message: str
    traceback: str = ""
    extra: dict = field(default_factory=dict)
    rank: int = 0  # the rank that reports it
