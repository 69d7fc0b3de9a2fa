"""Worker liveness: how the driver tells a slow worker from a frozen one, and a Stop the workers cannot honour.

A rank reports three counters, read by the driver without any lock a frozen worker could hold:
- beats: a daemon thread in the worker bumps it every BEAT_S. A stopped process (SIGSTOP, a frozen VM) or one stuck
  in the kernel sends none; a main thread blocked in a hung CUDA call or a deadlocked collective still beats.
- marks: bumped by the main thread at the start of a job and at every denoise-step boundary. A rank that beats but
  makes no step progress for `progress_s` is stuck (the hung driver call / deadlocked collective the beats miss).
- acks: the heartbeat thread copies the driver's Stop token there, so the driver knows within a beat that every rank
  saw the Stop even while the current step still runs.

`Watchdog.check` turns the counters into a verdict (None, or why the group must be killed, naming the ranks and the
bound); the executors kill the whole group, which restarts on next use. The bounds come from the environment so a
ComfyUI user (and the tests) can set them without a new node input:

  COMFYUI_H3_WORKER_TIMEOUT_S    a rank silent this long is hung (default 60; while the ranks start and load:
                                 max(this, 300), as imports and weight loading may hold the GIL for a while)
  COMFYUI_H3_PROGRESS_TIMEOUT_S  a rank with no step boundary this long in a job is stuck (default 1800; 0: off).
                                 Longer than the slowest legitimate step, decode or encode of your largest job.
  COMFYUI_H3_STOP_TIMEOUT_S      after Stop, how long the ranks may take to reach a step boundary (default 60)
A Stop that some rank does not acknowledge within min(5 s, worker timeout) kills the group at once.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

BEAT_S = 0.5
STOP_ACK_S = 5.0
STARTUP_S = 300.0  # a fresh process imports torch & co. before its first beat (slow on a loaded machine)
ENV_WORKER = "COMFYUI_H3_WORKER_TIMEOUT_S"
ENV_PROGRESS = "COMFYUI_H3_PROGRESS_TIMEOUT_S"
ENV_STOP = "COMFYUI_H3_STOP_TIMEOUT_S"


class WorkerHung(RuntimeError):
    """A rank stopped answering (or made no progress) within its bound; the group was killed."""


class StopForced(RuntimeError):
    """Stop was asked and the ranks did not stop in time; the group was killed (a Stop, not a failure)."""


def _env_seconds(name: str, default: float, allow_zero: bool = False) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds.") from None
    if value < 0 or (value == 0 and not allow_zero) or value != value:
        raise ValueError(f"{name}={raw!r} must be a positive number of seconds{' (0: off)' if allow_zero else ''}.")
    return value


@dataclass(frozen=True)
class Bounds:
    heartbeat_s: float = 60.0
    progress_s: float = 1800.0  # 0: no progress bound
    stop_s: float = 60.0

    @classmethod
    def from_env(cls) -> "Bounds":
        return cls(heartbeat_s=_env_seconds(ENV_WORKER, cls.heartbeat_s),
                   progress_s=_env_seconds(ENV_PROGRESS, cls.progress_s, allow_zero=True),
                   stop_s=_env_seconds(ENV_STOP, cls.stop_s))

    @property
    def startup_s(self) -> float:
        return max(self.heartbeat_s, STARTUP_S)

    @property
    def stop_ack_s(self) -> float:
        return min(STOP_ACK_S, self.heartbeat_s)


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {list(ranks)}"


class Watchdog:
    """Driver side. Feed it the counters each poll (`observe`); `check` says whether the group must go.

    Time is the driver's own clock, read when a counter is seen to change: no clock is shared with the workers."""

    def __init__(self, world: int, bounds: Bounds, clock: Callable[[], float] = time.monotonic):
        self.world, self.bounds, self.clock = world, bounds, clock
        now = clock()
        self._beat = [None] * world  # last value seen
        self._beat_at = [now] * world  # when it last changed (or the watch began)
        self._mark = [None] * world
        self._mark_at = [now] * world
        self._acks = [0] * world
        self.job_since: float | None = None
        self.stop_since: float | None = None
        self.stop_token = 0
        self.loading = True  # until every rank is Ready: the startup bound

    def loaded(self) -> None:
        self.loading = False

    def job_started(self) -> None:
        now = self.clock()
        self.job_since, self.stop_since, self.stop_token = now, None, 0
        self._mark_at = [now] * self.world

    def job_ended(self) -> None:
        self.job_since = self.stop_since = None
        self.stop_token = 0

    def stop_requested(self, token: int) -> None:
        if self.stop_since is None:
            self.stop_since, self.stop_token = self.clock(), token

    def observe(self, beats: Sequence[int], marks: Sequence[int], acks: Sequence[int]) -> None:
        now = self.clock()
        for rank in range(self.world):
            if beats[rank] != self._beat[rank]:
                if self._beat[rank] is not None or beats[rank]:
                    self._beat_at[rank] = now
                self._beat[rank] = beats[rank]
            if marks[rank] != self._mark[rank]:
                self._mark[rank], self._mark_at[rank] = marks[rank], now
            self._acks[rank] = acks[rank]

    def check(self) -> tuple[type, str] | None:
        """(WorkerHung | StopForced, message) when the group must be killed, else None."""
        now, b = self.clock(), self.bounds
        bound = b.startup_s if self.loading else b.heartbeat_s
        silent = [r for r in range(self.world) if now - self._beat_at[r] > bound]
        if self.stop_since is not None:
            waited = now - self.stop_since
            unacked = [r for r in range(self.world) if self._acks[r] != self.stop_token]
            if unacked and waited > b.stop_ack_s:
                return StopForced, (f"Stopped: worker {_ranks(unacked)} did not answer the Stop within "
                                    f"{b.stop_ack_s:g} s (frozen?), so the workers were killed; they restart on the "
                                    "next run.")
            if waited > b.stop_s:
                return StopForced, (f"Stopped: the workers did not reach a step boundary within {b.stop_s:g} s of "
                                    f"the Stop ({ENV_STOP}), so they were killed; they restart on the next run.")
        if silent:
            return WorkerHung, (f"Worker {_ranks(silent)} sent no heartbeat for {bound:g} s ({ENV_WORKER}): "
                                "frozen (a stopped process or a hung driver); all workers were killed and restart on "
                                "the next run.")
        if self.job_since is not None and b.progress_s:
            stuck = [r for r in range(self.world) if now - self._mark_at[r] > b.progress_s]
            if stuck:
                return WorkerHung, (f"Worker {_ranks(stuck)} made no step progress for {b.progress_s:g} s "
                                    f"({ENV_PROGRESS}; a hung device call or collective?); all workers were killed "
                                    "and restart on the next run.")
        return None


class Heartbeat:
    """Worker side: the thread that beats and acknowledges Stop. `beat()` / `ack(token)` write the shared counters;
    `stop_token()` reads the driver's Stop token (0: none). `orphaned()` -> the host is gone: after `orphan_grace_s`
    the process exits by itself, even when its main thread is stuck (the normal path exits at a step boundary)."""

    def __init__(self, beat: Callable[[], None], ack: Callable[[int], None], stop_token: Callable[[], int],
                 orphaned: Callable[[], bool] | None = None, orphan_grace_s: float = 60.0, interval_s: float = BEAT_S):
        self._beat, self._ack, self._token = beat, ack, stop_token
        self._orphaned, self._grace, self._interval = orphaned, orphan_grace_s, interval_s
        self._thread = threading.Thread(target=self._loop, name="comfyui-h3-heartbeat", daemon=True)

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def _loop(self) -> None:
        orphan_since = None
        while True:
            try:
                self._beat()
                token = self._token()
                if token:
                    self._ack(token)
            except Exception:  # noqa: BLE001 - a lost beat is the driver's to judge; never kill the thread
                pass
            if self._orphaned is not None and self._orphaned():
                orphan_since = orphan_since or time.monotonic()
                if time.monotonic() - orphan_since > self._grace:
                    os._exit(3)
            time.sleep(self._interval)
