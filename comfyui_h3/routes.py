"""HTTP routes of the pack (registered on ComfyUI's PromptServer when it is running; nothing happens elsewhere).

GET /h3/video_info?video=NAME[&path=...&force_rate=...]  -> {"frame_count", "width", "height", "fps"}
GET /h3/video_frame?video=NAME&frame=N[&max_size=512 ...] -> a JPEG of output frame N, longest side <= max_size

NAME / path are H3 Load Video's widget values: a file in ComfyUI's input folder (or with an ' [output]' / ' [temp]'
annotation); anything outside those folders is refused (403). The other parameters are H3 Load Video's options
(force_rate, skip_first_frames, frame_load_cap, select_every_nth, max_seconds, resize, fit, width, height), so frame N
is the frame the loader will output as N. The mask editor (js/mask_draw.js) shows these frames before anything runs.
"""

from __future__ import annotations

import dataclasses
import io
import os
import sys
import threading
from collections import OrderedDict

from . import comfy_services as services

_PLAN_CACHE: "OrderedDict[tuple, object]" = OrderedDict()
_PLAN_CACHE_SIZE = 8
_LOCK = threading.Lock()
_INT_OPTIONS = ("skip_first_frames", "frame_load_cap", "select_every_nth", "width", "height")
_FLOAT_OPTIONS = ("force_rate", "max_seconds")
_registered = False


def _options(query) -> dict:
    opts = {"force_rate": 24.0, "skip_first_frames": 0, "frame_load_cap": 0, "select_every_nth": 1,
            "max_seconds": 0.0, "resize": "none", "fit": "crop", "width": 1344, "height": 768}
    for key in _INT_OPTIONS:
        if query.get(key) not in (None, ""):
            opts[key] = int(float(query[key]))
    for key in _FLOAT_OPTIONS:
        if query.get(key) not in (None, ""):
            opts[key] = float(query[key])
    for key in ("resize", "fit"):
        if query.get(key):
            opts[key] = str(query[key])
    return opts


def resolve_source(query) -> str:
    """The file named by the query (`path` wins over `video`), inside ComfyUI's input folder: UnsafePathError when
    it would leave it, FileNotFoundError when missing."""
    name = (query.get("path") or "").strip() or (query.get("video") or "")
    if not name:
        raise FileNotFoundError("no video given")
    path = services.resolve_input_path(name, must_exist=True)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{name!r} is not a file")
    return path


def _plan(path: str, opts: dict):
    from .backend.media.decode import plan_frames

    stat = os.stat(path)
    key = (path, stat.st_mtime_ns, stat.st_size, tuple(sorted(opts.items())))
    with _LOCK:
        if key in _PLAN_CACHE:
            _PLAN_CACHE.move_to_end(key)
            return _PLAN_CACHE[key]
    plan = plan_frames(path, opts["frame_load_cap"], opts["skip_first_frames"], opts["select_every_nth"],
                       opts["force_rate"], opts["max_seconds"], resize=opts["resize"], fit=opts["fit"],
                       width=opts["width"], height=opts["height"])
    with _LOCK:
        _PLAN_CACHE[key] = plan
        while len(_PLAN_CACHE) > _PLAN_CACHE_SIZE:
            _PLAN_CACHE.popitem(last=False)
    return plan


def video_info(query) -> dict:
    plan = _plan(resolve_source(query), _options(query))
    return {"frame_count": plan.frame_count, "width": plan.width, "height": plan.height,
            "fps": float(plan.frame_rate)}


def frame_jpeg(query) -> bytes:
    """JPEG bytes of output frame `frame` (clamped to the clip), longest side at most `max_size` (16..2048)."""
    from PIL import Image

    from .backend.media.decode import decode_planned_frames

    path = resolve_source(query)
    plan = _plan(path, _options(query))
    index = min(max(int(query.get("frame") or 0), 0), plan.frame_count - 1)
    max_size = min(max(int(query.get("max_size") or 512), 16), 2048)
    one = dataclasses.replace(plan, sources=[plan.sources[index]])
    image = Image.fromarray(decode_planned_frames(path, one)[0].numpy())
    scale = max_size / max(image.size)
    if scale < 1:
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                             Image.BILINEAR)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()


def _prompt_server():
    """ComfyUI's PromptServer instance when its server module is loaded in this process, else None."""
    if "server" not in sys.modules:  # never import ComfyUI's server from a plain process
        return None
    try:
        from server import PromptServer  # ComfyUI's top-level module

        return getattr(PromptServer, "instance", None)
    except Exception:
        return None


def register_routes() -> bool:
    """Add the routes to ComfyUI's server (once); False when no PromptServer is running here."""
    global _registered
    if _registered:
        return True
    server = _prompt_server()
    if server is None or not hasattr(server, "routes"):
        return False
    import asyncio

    from aiohttp import web

    def _error(exc):
        status = 403 if isinstance(exc, services.UnsafePathError) else 404 if isinstance(exc, FileNotFoundError) else 400
        return web.json_response({"error": str(exc)}, status=status)

    @server.routes.get("/h3/video_info")
    async def _video_info(request):
        try:
            return web.json_response(await asyncio.to_thread(video_info, request.rel_url.query))
        except Exception as exc:  # bad names, unreadable files: a message, not a server error
            return _error(exc)

    @server.routes.get("/h3/video_frame")
    async def _video_frame(request):
        try:
            data = await asyncio.to_thread(frame_jpeg, request.rel_url.query)
        except Exception as exc:
            return _error(exc)
        return web.Response(body=data, content_type="image/jpeg", headers={"Cache-Control": "max-age=60"})

    _registered = True
    return True
