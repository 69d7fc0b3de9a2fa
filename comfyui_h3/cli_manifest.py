"""`--manifest` for generate / edit / extend / upscale: the request's stage manifest (backend/manifest.py) as
`<out>.manifest.json` beside the output. It is one more output of CliOutputs: its name is checked before any work
(an existing file is never overwritten), it is written to a temporary and published together with the video. A
numbered default output (generate without --out) gets its manifest once the number is known, as a new file."""

from __future__ import annotations

import time
from contextlib import contextmanager


def add_manifest_option(p) -> None:
    p.add_argument("--manifest", action="store_true",
                   help="Also write <out>.manifest.json beside the output: seconds per stage and per step, peak "
                        "memory per rank, weight policy, cache bytes, SP degree, versions.")


def plan_manifest(args, outputs, out_key: str | None) -> str | None:
    """The manifest's output key beside `out_key` (checked now, before any work), or None without --manifest or
    when `out_key` is numbered (then `finish_manifest` writes it after publishing)."""
    from .backend.manifest import manifest_path

    if not getattr(args, "manifest", False) or out_key is None or "_NNNNN" in out_key:
        return None
    return outputs.add(manifest_path(out_key))


@contextmanager
def timed_save(result):
    """Times the host's encode/save of the output into the result's manifest (stages.encode_save_s)."""
    t0 = time.perf_counter()
    yield
    manifest = getattr(result, "manifest", None)
    if isinstance(manifest, dict):
        stages = manifest.setdefault("stages", {})
        stages["encode_save_s"] = (stages.get("encode_save_s") or 0.0) + time.perf_counter() - t0


def write_manifest(outputs, key: str | None, result) -> None:
    """Stage the manifest for publishing with the other outputs (no-op without a key)."""
    if key is None:
        return
    from .backend.manifest import dumps

    text = dumps(manifest_of(result))

    def writer(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    outputs.write(key, writer)


def finish_manifest(args, paths: list[str], result, key: str | None) -> str | None:
    """After publishing: a numbered video's manifest (never over an existing file); -> its path or None."""
    if not getattr(args, "manifest", False) or key is not None or not paths:
        return None
    from .backend.manifest import manifest_path, write_new

    video = next((p for p in paths if p.endswith(".mp4")), None)
    return None if video is None else write_new(manifest_path(video), manifest_of(result))


def manifest_of(result) -> dict:
    manifest = getattr(result, "manifest", None)
    if not isinstance(manifest, dict):
        raise RuntimeError("The engine returned no stage manifest for this request.")
    return manifest
