"""Extension in a real ComfyUI (the integration lane; skipped without COMFYUI_DIR): the shipped extension workflows
run through /prompt and give playable MP4s of source + added frames, and Stop mid-run keeps the finished windows as
H3/extend_partial_NNNNN.mp4 with the next prompt working."""

import asyncio
import json
import os
import uuid

import pytest

from comfyui_lane import COMFYUI_DIR, NO_COMFYUI, WORKFLOWS, probe_mp4

pytestmark = pytest.mark.skipif(not COMFYUI_DIR, reason=NO_COMFYUI)


@pytest.fixture(scope="module")
def demo_inputs(comfy):
    from comfyui_h3.cli import _write_demo_inputs

    _write_demo_inputs(str(comfy.input_dir))
    return comfy


def test_extension_workflows(demo_inputs, tmp_path):
    comfy = demo_inputs
    runs = {
        # 3 s -> 85 frames in 56-frame windows: 34 + 34 + 17 (one prompt for all)
        "h3_extension.api.json": (["3.steps=1", "3.seconds=3.0", "3.window_frames=56", '3.prompt="waves roll in"'],
                                  124 + 85),
        # the sampler's latents continued: 1 window of 56 frames adds 34
        "h3_generate_then_extend.api.json": (["2.steps=1", "3.steps=1", "3.windows=1", "3.window_frames=56"],
                                             124 + 34),
    }
    for name, (sets, frames) in runs.items():
        result = comfy.run_cli(name, tmp_path / name, *sets)
        assert result.returncode == 0, comfy.why(f"{name}: {result.stderr[-3000:]}")
        (saved,) = [line for line in result.stdout.splitlines() if line.strip()]
        probe = probe_mp4(saved)
        assert probe["frames"] == frames and probe["fps"] == 24.0 and probe["audio"] == 1, (name, probe)


async def _run_and_stop(url: str, prompt: dict, node: str, total_steps: int, stop_after_steps: int) -> str:
    """Queue `prompt`, follow its progress over the websocket, POST /interrupt once `node` reports
    `stop_after_steps` of its `total_steps` denoising steps done (its source decode reports progress too, with
    another total); returns the prompt id."""
    import aiohttp

    client = uuid.uuid4().hex
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(f"{url}/ws?clientId={client}") as ws:
            async with session.post(f"{url}/prompt", json={"prompt": prompt, "client_id": client}) as resp:
                assert resp.status == 200, await resp.text()
                prompt_id = (await resp.json())["prompt_id"]
            async for message in ws:
                if message.type != aiohttp.WSMsgType.TEXT:
                    continue
                event = json.loads(message.data)
                data = event.get("data", {})
                if event.get("type") == "progress" and data.get("node") == node and \
                        data.get("prompt_id") == prompt_id and data.get("max") == total_steps and \
                        data.get("value", 0) >= stop_after_steps:
                    async with session.post(f"{url}/interrupt", json={}) as resp:
                        assert resp.status == 200
                    return prompt_id
                if event.get("type") in ("execution_error", "execution_success") and \
                        data.get("prompt_id") == prompt_id:
                    raise AssertionError(f"the prompt ended before it could be stopped: {event}")
    raise AssertionError("the websocket closed before the prompt made progress")


def test_stop_keeps_the_finished_windows(demo_inputs):
    comfy = demo_inputs
    with open(WORKFLOWS / "h3_extension.api.json") as handle:
        prompt = json.load(handle)
    prompt["3"]["inputs"].update(steps=1, windows=30, window_frames=56, prompt="waves roll in")
    prompt_id = asyncio.run(_run_and_stop(comfy.url, prompt, "3", 30, stop_after_steps=2))  # window 2 done
    entry = comfy.wait_for_prompt(prompt_id)
    assert entry["status"]["status_str"] == "error", entry["status"]
    partial_dir = comfy.output_dir / "H3"
    kept = sorted(n for n in os.listdir(partial_dir) if n.startswith("extend_partial_"))
    assert kept, comfy.why("no partial file was kept")
    probe = probe_mp4(str(partial_dir / kept[-1]))
    done = (probe["frames"] - 124) // 34
    assert probe["frames"] == 124 + 34 * done and 2 <= done < 30, probe
    assert "extend_partial_" in comfy.log(), comfy.why("the partial file is not named in the log")
    # the engine is fine afterwards
    prompt["3"]["inputs"].update(windows=1)
    status, body = comfy.request("/prompt", {"prompt": prompt})
    assert status == 200, body
    assert comfy.wait_for_prompt(body["prompt_id"])["status"]["status_str"] == "success"
