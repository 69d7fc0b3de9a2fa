"""Integration lane: live sampling previews and H3 Preview Video in a real ComfyUI (tests/comfyui_lane.py starts it,
with COMFYUI_H3_PREVIEW_EVERY=2). A websocket client, as the frontend is, queues Loader -> H3 Sample -> H3 Preview
Video on the tiny model: with the frontend's preview method "auto" the Sample node's binary preview messages arrive at
steps 2 and 4 of 4; with ComfyUI's default method (none) there are none. The finished clip is served from
/view?type=temp and nothing is written to the output folder. Skipped, saying why, when COMFYUI_DIR is unset."""

from __future__ import annotations

import asyncio
import io
import json
import os
import struct
import uuid
from pathlib import Path

import pytest
from comfyui_lane import COMFYUI_DIR, NO_COMFYUI, RUN_TIMEOUT_S, probe_mp4

pytestmark = pytest.mark.skipif(not COMFYUI_DIR, reason=NO_COMFYUI)

EVERY, STEPS = 2, 4
PREVIEW_IMAGE, PREVIEW_IMAGE_WITH_METADATA = 1, 4  # ComfyUI's protocol.BinaryEventTypes


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    from comfyui_lane import running_comfyui

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COMFYUI_H3_PREVIEW_EVERY", str(EVERY))  # read by the pack inside the server
        with running_comfyui(tmp_path_factory.mktemp("comfyui")) as server:
            yield server


def _prompt(comfy, seed: int) -> dict:
    """Loader -> H3 Sample -> H3 Preview Video; inputs not set here at their /object_info defaults."""
    status, info = comfy.request("/object_info")
    assert status == 200 and "H3_PreviewVideo" in info, comfy.why("H3_PreviewVideo is not in /object_info")

    def inputs(class_type: str, **given) -> dict:
        for name, spec in info[class_type]["input"]["required"].items():
            options = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
            if name not in given and "default" in options:
                given[name] = options["default"]
        return given

    return {
        "1": {"class_type": "H3_ModelLoader", "inputs": inputs(
            "H3_ModelLoader", model="tiny-h3 (built-in test model, makes noise)", device="cpu", dtype="float32")},
        "2": {"class_type": "H3_Sample", "inputs": inputs(
            "H3_Sample", engine=["1", 0], prompt="a paper boat on a puddle", seconds=5.0, width=96, height=64,
            steps=STEPS, seed=seed)},
        "3": {"class_type": "H3_PreviewVideo", "inputs": {"video": ["2", 0]}},
    }


async def _run(url: str, prompt: dict, extra_data: dict) -> tuple[str, list, list]:
    """Queue `prompt` as the frontend does and follow it over the websocket until it finishes: (prompt id, the
    binary previews as (metadata, image bytes), the Sample node's progress values)."""
    import aiohttp

    client_id = uuid.uuid4().hex
    previews, progress = [], []
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(f"{url.replace('http', 'ws', 1)}/ws?clientId={client_id}",
                                      max_msg_size=0) as ws:
            # The frontend's first message: it takes previews with metadata (the node they belong to).
            await ws.send_str(json.dumps({"type": "feature_flags", "data": {"supports_preview_metadata": True}}))
            async with session.post(f"{url}/prompt", json={"prompt": prompt, "client_id": client_id,
                                                           "extra_data": extra_data}) as resp:
                body = await resp.json()
                assert resp.status == 200, body
            prompt_id = body["prompt_id"]
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.BINARY:
                    (event,) = struct.unpack(">I", msg.data[:4])
                    if event == PREVIEW_IMAGE_WITH_METADATA:
                        (size,) = struct.unpack(">I", msg.data[4:8])
                        previews.append((json.loads(msg.data[8:8 + size]), bytes(msg.data[8 + size:])))
                    elif event == PREVIEW_IMAGE:  # the format without metadata: must not come to this client
                        previews.append(({}, bytes(msg.data[8:])))
                    continue
                if msg.type != aiohttp.WSMsgType.TEXT:
                    raise AssertionError(f"websocket closed: {msg.type}")
                message = json.loads(msg.data)
                data = message.get("data", {})
                if data.get("prompt_id") not in (None, prompt_id):
                    continue
                if message["type"] == "progress" and data.get("node") == "2":
                    progress.append(data["value"])
                elif message["type"] == "execution_error":
                    raise AssertionError(f"the prompt failed: {data.get('exception_message')}")
                elif message["type"] in ("executing", "execution_success") and data.get("node") is None and \
                        data.get("prompt_id") == prompt_id:
                    break
    return prompt_id, previews, progress


def _steps_seen(comfy, progress: list) -> None:
    """The Sample node's progress over the websocket: every step, in order; a ComfyUI that throttles its progress
    messages (0.3x: one per 100 ms, the first, the last and those with a preview always) may leave steps out."""
    run = progress[len(progress) - 1 - progress[::-1].index(1):] if 1 in progress else progress  # the last run
    throttled = "PROGRESS_THROTTLE" in (Path(COMFYUI_DIR) / "comfy" / "utils.py").read_text(encoding="utf-8")
    if not throttled:
        assert run == list(range(1, STEPS + 1)), progress
    else:
        assert run[0] == 1 and run[-1] == STEPS and run == sorted(set(run)) and set(run) <= set(range(1, STEPS + 1)), \
            progress


def _follow(comfy, prompt: dict, extra_data: dict):
    try:
        return asyncio.run(asyncio.wait_for(_run(comfy.url, prompt, extra_data), RUN_TIMEOUT_S))
    except (AssertionError, asyncio.TimeoutError) as exc:
        raise AssertionError(comfy.why(f"{type(exc).__name__}: {exc}")) from None


def _temp_clip(comfy, prompt_id: str, tmp_path, name: str) -> dict:
    """The clip H3 Preview Video showed, fetched as the frontend fetches it (/view?type=temp)."""
    entry = comfy.wait_for_prompt(prompt_id)
    assert entry["status"]["status_str"] == "success", comfy.why(json.dumps(entry["status"]))
    (item,) = entry["outputs"]["3"]["images"]
    assert item["type"] == "temp" and item["subfolder"] == "h3_preview", item
    found = [root for root, _, files in os.walk(comfy.root / "temp") if item["filename"] in files]
    assert len(found) == 1 and found[0].endswith(item["subfolder"]), found  # under --temp-directory (its temp/)
    path = tmp_path / name
    path.write_bytes(comfy.view(item))
    return probe_mp4(str(path))


def test_previews_arrive_over_the_websocket_at_the_interval(comfy, tmp_path):
    from PIL import Image

    prompt_id, previews, progress = _follow(comfy, _prompt(comfy, seed=1), {"preview_method": "auto"})
    _steps_seen(comfy, progress)
    assert len(previews) == STEPS // EVERY, [meta for meta, _ in previews]  # steps 2 and 4
    for meta, image in previews:
        assert meta.get("node_id") == "2" and meta.get("prompt_id") == prompt_id, meta
        assert meta.get("image_type") == "image/jpeg", meta
        with Image.open(io.BytesIO(image)) as picture:
            picture.load()
            assert picture.format == "JPEG" and max(picture.size) == 512  # ComfyUI's --preview-size
            assert abs(picture.size[0] / picture.size[1] - 1.5) < 0.02  # 2 x 2 frames of the 96x64 canvas
    probe = _temp_clip(comfy, prompt_id, tmp_path, "with_previews.mp4")
    assert probe["frames"] == 124 and probe["audio"] == 1 and probe["size"] == (96, 64), probe
    assert not any(files for _, _, files in os.walk(comfy.output_dir)), "H3 Preview Video wrote to the output folder"


def test_no_previews_with_comfyui_default_preview_method(comfy, tmp_path):
    prompt_id, previews, progress = _follow(comfy, _prompt(comfy, seed=2), {})  # the server's --preview-method: none
    _steps_seen(comfy, progress)
    assert previews == []
    probe = _temp_clip(comfy, prompt_id, tmp_path, "without_previews.mp4")
    assert probe["frames"] == 124, probe
