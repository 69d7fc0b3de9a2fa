"""The template browser's order of the pack's cards (issue 28 #9): the declaration (comfyui_h3/templates.py) covers
exactly the shipped UI workflows, in a newcomer's order, and the middleware ComfyUI's server gets reorders this
pack's entry of a real aiohttp /workflow_templates answer (glob order, as ComfyUI gives it) and nothing else. The same
in the browser of a real ComfyUI: tests/lane/test_comfyui_hardening_ui.py."""

import asyncio
import random

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from repo_paths import REPO
from comfyui_h3 import routes
from comfyui_h3.native_workflows import NATIVE_WORKFLOWS
from comfyui_h3.templates import CARDS, ordered

TEMPLATES = REPO / "example_workflows"
NAMES = [card.name for card in CARDS]


def test_every_shipped_workflow_has_one_card():
    assert sorted(NAMES) == sorted(p.stem for p in TEMPLATES.glob("*.json"))
    assert len(set(NAMES)) == len(NAMES)


def test_the_order_is_a_newcomers():
    """Generation first (text to video first), then image to video, editing, extension, upscaling; the workflows
    that need ComfyUI's own H3 nodes last."""
    rank = {name: k for k, name in enumerate(NAMES)}
    assert NAMES[0] == "h3_text_to_video"
    steps = ["h3_text_to_video", "h3_first_last_frame", "h3_object_removal", "h3_extension", "seedvr2_upscale_video"]
    assert [rank[n] for n in steps] == sorted(rank[n] for n in steps)
    assert sorted(rank[n] for n in NATIVE_WORKFLOWS) == list(range(len(NAMES) - len(NATIVE_WORKFLOWS), len(NAMES)))


def test_names_without_a_card_come_after_the_cards():
    assert ordered(["zz_mine", *reversed(NAMES), "aa_mine"]) == [*NAMES, "aa_mine", "zz_mine"]


def _listing_app(listing, status=200):
    app = web.Application(middlewares=[routes.template_order_middleware()])

    async def templates(request):
        return web.json_response(listing, status=status)

    async def other(request):
        return web.json_response(listing)

    app.router.add_get("/workflow_templates", templates)
    app.router.add_get("/api/workflow_templates", templates)
    app.router.add_get("/object_info", other)
    return app


async def _get(app, path):
    async with TestClient(TestServer(app)) as client:
        response = await client.get(path)
        return response.status, await response.json()


def test_the_middleware_orders_this_packs_entry_only():
    shuffled = NAMES[:]
    random.Random(3).shuffle(shuffled)
    other_pack = ["b_flow", "a_flow", "c_flow"]
    listing = {"some-other-pack": other_pack, "ComfyUI-H3-renamed": shuffled + ["my_own_flow"]}
    for path in ("/workflow_templates", "/api/workflow_templates"):
        status, body = asyncio.run(_get(_listing_app(listing), path))
        assert status == 200
        assert body == {"some-other-pack": other_pack, "ComfyUI-H3-renamed": [*NAMES, "my_own_flow"]}
        assert list(body) == list(listing)  # the packs keep their order too
    # other routes and failed answers pass untouched
    assert asyncio.run(_get(_listing_app(listing), "/object_info"))[1] == listing
    assert asyncio.run(_get(_listing_app(listing, status=500), "/workflow_templates")) == (500, listing)


def test_a_pack_holding_only_some_of_the_names_is_not_ours():
    partial = list(reversed(NAMES[:3]))
    body = asyncio.run(_get(_listing_app({"x": partial}), "/workflow_templates"))[1]
    assert body == {"x": partial}


def test_it_is_registered_on_the_server_before_it_serves(monkeypatch):
    """Once on ComfyUI's app (aiohttp takes middlewares until it starts serving); none when no server runs here."""
    class Server:
        app = web.Application()

    monkeypatch.setattr(routes, "_order_registered", False)
    monkeypatch.setattr(routes, "_prompt_server", lambda: None)
    assert routes.register_template_order() is False
    server = Server()
    monkeypatch.setattr(routes, "_prompt_server", lambda: server)
    assert routes.register_template_order() is True and routes.register_template_order() is True
    assert len(server.app.middlewares) == 1

    async def glob_order(request):
        return web.json_response({"p": NAMES[::-1]})

    server.app.router.add_get("/workflow_templates", glob_order)
    assert asyncio.run(_get(server.app, "/workflow_templates"))[1] == {"p": NAMES}
