"""The stage manifest of one request: what ran (kind, family, shapes, seed, steps), how (weight policy, attention,
SP degree, devices, versions) and what it cost (seconds per stage, each denoise step, peak memory per rank, AdaLN
cache bytes, engine load time when this request started the engine). Plain JSON-able dict; the schema is stated
once, here (`SCHEMA`, `new_manifest`), and filled by three hands:

- the rank-0 pipeline (`StageRecorder` on every rank, `pipeline_part`): request, stages, per-rank peaks;
- the engine (`engine_part`): configuration, devices, load time, versions;
- whoever writes the output (CLI, H3 Save Video): `stages["encode_save_s"]`, then `write_beside` (never overwrites).

Timing adds no device sync on the hot path: per-step times on CUDA come from events recorded at each step boundary
(`torch.cuda.Event.record` only queues a marker) and are read once after the loop, where the caller copies the result
to the host anyway; on the CPU the host clock between steps is exact. Text / condition encode and decode are host
times around stages that end in a host copy or a broadcast. SeedVR2's stage seconds come from its own `timings=True`
path (which synchronises at stage borders, as its request says).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import time
from typing import Iterator

import torch

SCHEMA = "comfyui-h3/manifest/1"
STAGE_KEYS = ("text_encode_s", "condition_encode_s", "denoise_steps_s", "denoise_s", "decode_s", "encode_save_s",
              "total_s")


def new_manifest() -> dict:
    """Every key a manifest has (None / empty until filled): the one statement of the schema."""
    return {
        "schema": SCHEMA,
        "request": {"kind": None, "family": None, "task": None, "shapes": {}, "seed": None, "steps": None,
                    "schedule": None},  # where a family names one (H3: name, video_shift, audio_shift as run)
        "engine": {"family": None, "devices": [], "sp_degree": None, "attention": None, "compute_dtype": None,
                   "vae_dtype": None,  # as the VAE ran, where a family reports it (SeedVR2: float32 on a CPU
                   # without native bf16 when bf16 was asked for)
                   "weights": {},  # the weight policy: storage, placement, resident_blocks (None: auto or all)
                   "placement": None,  # the offload placement's last plan and weight moves, where a family
                   # reports them (SeedVR2: resident / streamed DiT blocks, VAE moves); None: resident
                   "executor": None, "load_s": None,
                   "loras": [],  # each LoRA merged into the DiT: file, sha256, strength, adaln_strength
                   "live_switch": None},  # live options (H3's LoRAs) changed before this request: in place
        # {"in_place": true, "s", "partitions": {name: {"weights", "lora_bytes"}}}, or by starting the workers
        # again {"in_place": false, "why"}; None: the engine already ran with them
        "stages": {key: ([] if key == "denoise_steps_s" else None) for key in STAGE_KEYS},
        "extra_stages": {},  # a family's own stage seconds (SeedVR2: prepare / encode / dit / decode / colour fix)
        "peak_memory": [],  # one entry per rank: rank, device, peak_device_bytes (this request's; None on CPU),
        # peak_host_rss_bytes (the worker process's peak so far: the OS counter cannot be reset per request)
        "adaln_cache": None,  # per partition: table_bytes vs weight bytes (host / device); None: direct projection
        "step_cache": None,  # H3's step cache (pipelines/h3/step_cache.summary): each plan's cached steps and
        # measures, sigma_points, forwards_computed, steps_cached, seconds_per_forward; None: off
        "versions": {},
    }


class StageRecorder:
    """One request's clocks on one rank. Created at the start of the request (resets the device's peak counter so
    the peak is this request's)."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self.stages: dict[str, float] = {}
        self.step_seconds: list[float] = []
        self._marks: list = []

    def add(self, stage: str, seconds: float) -> None:
        self.stages[stage] = self.stages.get(stage, 0.0) + seconds

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    # ---- denoise steps (no sync inside the loop) -----------------------------------------------------------------
    def _mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    def steps_begin(self) -> None:
        self._marks = [self._mark()]

    def step_done(self) -> None:
        self._marks.append(self._mark())

    def steps_end(self) -> None:
        """Turn the marks into seconds per step (one wait for the last event, after the loop)."""
        marks, self._marks = self._marks, []
        if len(marks) < 2:
            return
        if self.cuda:
            marks[-1].synchronize()
            self.step_seconds += [a.elapsed_time(b) / 1000.0 for a, b in zip(marks, marks[1:])]
        else:
            self.step_seconds += [b - a for a, b in zip(marks, marks[1:])]

    # ---- memory ------------------------------------------------------------------------------------------------
    def own_peak(self, rank: int = 0) -> dict:
        device_peak = int(torch.cuda.max_memory_allocated(self.device)) if self.cuda else None
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS; process lifetime
        rss = int(rss if sys.platform == "darwin" else rss * 1024)
        return {"rank": rank, "device": str(self.device), "peak_device_bytes": device_peak, "peak_host_rss_bytes": rss}

    def peaks(self, parallel) -> list[dict]:
        """Every rank's peak, on every rank (one small CPU all-gather at the end of a request: every rank of the
        engine must call it, in the same place). One rank: just its own."""
        mine = self.own_peak(parallel.rank)
        if not parallel.is_parallel:
            return [mine]
        import torch.distributed as dist

        index = int(self.device.index or 0) if self.cuda else -1
        local = torch.tensor([mine["peak_device_bytes"] if self.cuda else -1, mine["peak_host_rss_bytes"], index],
                             dtype=torch.int64)
        gathered = [torch.zeros_like(local) for _ in range(parallel.world)]
        dist.all_gather(gathered, local, group=parallel.group)
        entries = []
        for rank, row in enumerate(gathered):
            device_peak, rss, idx = (int(v) for v in row.tolist())
            name = f"cuda:{idx}" if idx >= 0 else "cpu"
            entries.append({"rank": rank, "device": name, "peak_device_bytes": None if device_peak < 0 else device_peak,
                            "peak_host_rss_bytes": rss})
        return entries


def pipeline_part(recorder: StageRecorder, parallel, *, kind: str, family: str, task: str, shapes: dict,
                  seed: int | None, steps: int | None, timings: dict, adaln: dict | None = None) -> dict:
    """What a rank-0 pipeline knows, as a manifest (engine fields still empty). `timings`: the task's own
    encode_s / denoise_s / decode_s / total_s (host seconds) — mapped onto the schema's stages. Call it on EVERY
    rank (the peaks are gathered); only rank 0's return value is used."""
    m = new_manifest()
    m["request"].update(kind=kind, family=family, task=task, shapes=dict(shapes), seed=seed, steps=steps)
    stages = m["stages"]
    text = recorder.stages.get("text_encode_s")
    stages["text_encode_s"] = text
    if "encode_s" in timings:
        stages["condition_encode_s"] = max(0.0, timings["encode_s"] - (text or 0.0))
    stages["denoise_steps_s"] = list(recorder.step_seconds)
    for key in ("denoise_s", "decode_s", "total_s"):
        if isinstance(timings.get(key), (int, float)):
            stages[key] = float(timings[key])
    if "encode_save_s" in recorder.stages:  # written on a worker (a streamed output)
        stages["encode_save_s"] = recorder.stages["encode_save_s"]
    m["peak_memory"] = recorder.peaks(parallel)
    m["adaln_cache"] = adaln or None
    return m


def engine_part(manifest: dict, config, load_s: float | None) -> dict:
    """Fill the engine's fields (the host side: the engine knows its configuration and whether this request
    started it). `config`: an EngineConfig."""
    from dataclasses import asdict, is_dataclass

    weights = config.weights
    manifest["engine"].update(
        family=config.family, devices=list(config.devices()), sp_degree=int(config.world_size),
        attention=str(config.attention), compute_dtype=config.compute_dtype,
        weights=asdict(weights) if is_dataclass(weights) else dict(weights), executor=config.executor,
        load_s=load_s, loras=[c.record() for c in getattr(config.options, "loras", ())])
    manifest["versions"] = versions()
    return manifest


def versions() -> dict:
    try:
        from importlib.metadata import version

        package = version("comfyui-h3")
    except Exception:  # noqa: BLE001 - loaded by path into ComfyUI without an install
        package = None
    return {"comfyui_h3": package, "torch": torch.__version__, "python": sys.version.split()[0]}


def summary(manifest: dict | None) -> str:
    """One short line for a node: total seconds, seconds per step, peak device GiB (largest rank)."""
    if not manifest:
        return ""
    stages = manifest.get("stages", {})
    parts = []
    if stages.get("total_s") is not None:
        parts.append(f"{stages['total_s']:.1f} s")
    steps = stages.get("denoise_steps_s") or []
    if steps:
        parts.append(f"{sum(steps) / len(steps):.2f} s/step")
    peaks = [p["peak_device_bytes"] for p in manifest.get("peak_memory", []) if p.get("peak_device_bytes") is not None]
    if peaks:
        parts.append(f"peak {max(peaks) / 2**30:.1f} GiB")
    return ", ".join(parts)


def manifest_path(output_path: str) -> str:
    """`<out>.manifest.json` beside the output (the whole file name kept: out.mp4 -> out.mp4.manifest.json)."""
    return os.fspath(output_path) + ".manifest.json"


def dumps(manifest: dict) -> str:
    return json.dumps(manifest, indent=2, sort_keys=False, default=_jsonable) + "\n"


def write_new(path: str, manifest: dict) -> str:
    """Write `manifest` to `path`, which must not exist (never overwrites a user's file: FileExistsError naming it);
    the content appears whole (written to a hidden temporary, then linked into place)."""
    import secrets

    path = os.path.abspath(path)
    if os.path.lexists(path):
        raise FileExistsError(f"{path} exists; the manifest is never written over a file.")
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
    with open(tmp, "x", encoding="utf-8") as f:
        f.write(dumps(manifest))
    try:
        os.link(tmp, path)  # fails if the name was taken meanwhile
    finally:
        os.unlink(tmp)
    return path


def _jsonable(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if hasattr(value, "__fspath__"):
        return os.fspath(value)
    return str(value)
