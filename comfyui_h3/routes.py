"""HTTP routes of the pack (registered on ComfyUI's PromptServer when it is running; nothing happens elsewhere).

GET /h3/video_info?video=NAME[&path=...&force_rate=...]  -> {"frame_count", "width", "height", "fps"}
GET /h3/video_frame?video=NAME&frame=N[&max_size=512 ...] -> a JPEG of output frame N, longest side <= max_size

NAME / path are H3 Load Video's widget values: a file in ComfyUI's input folder (or with an ' [output]' / ' [temp]'
annotation); anything outside those folders is refused (403). The other parameters are H3 Load Video's options
(force_rate, skip_first_frames, frame_load_cap, select_every_nth, max_seconds, resize, fit, width, height), so frame N
is the frame the loader will output as N. The mask editor (js/mask_draw.js) shows these frames before anything runs.

Every parameter is checked before any file is opened, against H3 Load Video's own widget declaration (type, min / max,
choices), so a route takes exactly what the node takes; frame must be inside the clip and max_size in 16..2048.
Anything else is answered 400 with a one-line message.
"""

from __future__ import annotations

import functools
import io
import math
import os
import sys
import threading
from collections import OrderedDict

from . import comfy_services as services
from .backend.pipelines.h3.geometry import RequestError

_PLAN_CACHE: "OrderedDict[tuple, object]" = OrderedDict()
_PLAN_CACHE_SIZE = 8
_LOCK = threading.Lock()
# The loader widgets the routes take (H3 Load Video's names); their types, bounds, choices and defaults are read from
# the node's own declaration, so a route accepts exactly what the node accepts.
LOADER_OPTIONS = ("force_rate", "skip_first_frames", "frame_load_cap", "select_every_nth", "max_seconds", "resize",
                  "fit", "width", "height")
MAX_SIZE_RANGE = (16, 2048)  # longest side of a served JPEG
_registered = False


@functools.lru_cache(maxsize=1)
def loader_option_specs() -> dict:
    """{name: (type, options)} of H3 Load Video's widgets in LOADER_OPTIONS (type: "INT", "FLOAT" or a choice list)."""
    from .nodes.load_video import H3LoadVideo

    declared = H3LoadVideo.INPUT_TYPES()["required"]
    return {name: (declared[name][0], dict(declared[name][1])) for name in LOADER_OPTIONS}


def _number(name: str, text, kind: str, lo, hi):
    """`text` parsed as an INT / FLOAT query value within [lo, hi] (None: unbounded); RequestError otherwise."""
    text = str(text).strip()
    try:
        value = float(text)
    except ValueError:
        raise RequestError(f"{name} must be a number, got {text!r}.") from None
    if not math.isfinite(value):
        raise RequestError(f"{name} must be a finite number, got {text!r}.")
    if kind == "INT":
        if value != int(value):
            raise RequestError(f"{name} must be a whole number, got {text!r}.")
        value = int(value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise RequestError(f"{name} must be between {lo} and {hi}, got {text}.")
    return value


def _options(query) -> dict:
    """The loader options of the query, each checked against H3 Load Video's widget (missing / empty: its default)."""
    opts = {}
    for name, (kind, spec) in loader_option_specs().items():
        raw = query.get(name)
        if raw is None or str(raw) == "":
            opts[name] = spec["default"]
        elif isinstance(kind, (list, tuple)):
            if raw not in kind:
                raise RequestError(f"{name} must be one of {', '.join(map(str, kind))}; got {raw!r}.")
            opts[name] = raw
        else:
            opts[name] = _number(name, raw, kind, spec.get("min"), spec.get("max"))
    return opts


def _int_param(query, name: str, default: int, lo: int, hi: int | None) -> int:
    raw = query.get(name)
    return default if raw is None or str(raw) == "" else _number(name, raw, "INT", lo, hi)


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


def _cache_key(path: str, opts: dict) -> tuple:
    stat = os.stat(path)
    return (path, stat.st_mtime_ns, stat.st_size, tuple(sorted(opts.items())))


def _cached(key):
    with _LOCK:
        if key in _PLAN_CACHE:
            _PLAN_CACHE.move_to_end(key)
            return _PLAN_CACHE[key]
    return None


def _plan(path: str, opts: dict):
    from .backend.media.decode import plan_frames

    key = _cache_key(path, opts)
    plan = _cached(key)
    if plan is not None:
        return plan
    plan = plan_frames(path, opts["frame_load_cap"], opts["skip_first_frames"], opts["select_every_nth"],
                       opts["force_rate"], opts["max_seconds"], resize=opts["resize"], fit=opts["fit"],
                       width=opts["width"], height=opts["height"])
    with _LOCK:
        _PLAN_CACHE[key] = plan
        while len(_PLAN_CACHE) > _PLAN_CACHE_SIZE:
            _PLAN_CACHE.popitem(last=False)
    return plan


def video_info(query) -> dict:
    opts = _options(query)
    plan = _plan(resolve_source(query), opts)
    return {"frame_count": plan.frame_count, "width": plan.width, "height": plan.height,
            "fps": float(plan.frame_rate)}


def frame_jpeg(query) -> bytes:
    """JPEG bytes of output frame `frame`, longest side at most `max_size` (16..2048). Only what that frame needs is
    read: the plan stops at it (unless the whole clip's plan is cached) and decoding starts at the keyframe before it."""
    from PIL import Image

    from .backend.media.decode import decode_planned_frame

    opts = _options(query)
    index = _int_param(query, "frame", 0, 0, None)
    max_size = _int_param(query, "max_size", 512, *MAX_SIZE_RANGE)
    cap = opts["frame_load_cap"]
    if cap and index >= cap:
        raise RequestError(f"frame {index} is past frame_load_cap={cap} (frames are numbered from 0).")
    path = resolve_source(query)
    plan = _cached(_cache_key(path, opts)) or _plan(path, dict(opts, frame_load_cap=index + 1))
    if index >= plan.frame_count:
        raise RequestError(f"frame {index} is past the end of the clip ({plan.frame_count} frames, numbered from 0).")
    image = Image.fromarray(decode_planned_frame(path, plan, index).numpy())
    scale = max_size / max(image.size)
    if scale < 1:
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                             Image.BILINEAR)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()


def error_status(exc: BaseException) -> int:
    """HTTP status of a route's error: 403 outside the allowed folders, 404 no such file, 400 anything else (bad
    parameters, unreadable files): a message, never a server error."""
    if isinstance(exc, services.UnsafePathError):
        return 403
    return 404 if isinstance(exc, FileNotFoundError) else 400


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
        return web.json_response({"error": str(exc)}, status=error_status(exc))

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


_order_registered = False
LISTING_PATHS = ("/workflow_templates", "/api/workflow_templates")  # ComfyUI serves its routes at both


def reorder_listing(listing: dict) -> dict:
    """ComfyUI's template listing ({pack folder: [workflow names]}) with this pack's names in the cards' order
    (comfyui_h3/templates.py). The pack's entry is the one holding every shipped card (its folder name is the user's
    choice); other packs' entries are left as they are."""
    from .templates import CARDS, ordered

    ours = {card.name for card in CARDS}
    return {pack: ordered(names) if isinstance(names, list) and ours <= set(names) else names
            for pack, names in listing.items()}


def template_order_middleware():
    """An aiohttp middleware that passes every request through and reorders the pack's entry in a successful
    /workflow_templates answer (ComfyUI lists it in glob order, which the frontends show as it comes)."""
    import json

    from aiohttp import web

    @web.middleware
    async def _template_order(request, handler):
        response = await handler(request)
        if request.path not in LISTING_PATHS or getattr(response, "status", None) != 200:
            return response
        try:
            listing = json.loads(response.body)
        except (AttributeError, TypeError, ValueError):  # not a JSON body (a stream): leave it
            return response
        if not isinstance(listing, dict):
            return response
        return web.json_response(reorder_listing(listing))

    return _template_order


def register_template_order() -> bool:
    """Add the middleware to ComfyUI's server (once, before it starts serving); False when none runs here or it is
    already serving (aiohttp freezes its middlewares then)."""
    global _order_registered
    if _order_registered:
        return True
    server = _prompt_server()
    app = getattr(server, "app", None)
    if app is None or getattr(app, "frozen", False):
        return False
    try:
        app.middlewares.append(template_order_middleware())
    except RuntimeError:  # frozen meanwhile: the listing keeps ComfyUI's order
        return False
    _order_registered = True
    return True
