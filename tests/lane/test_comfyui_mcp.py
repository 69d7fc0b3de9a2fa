"""Integration lane: the MCP server (`python -m comfyui_h3 mcp --server URL`) in front of a real ComfyUI, driven by
the SDK's own client: the tools' schemas from the server's /object_info, an upload through /upload/image, jobs run
as prompts with progress from the websocket, their files and manifests read back through /view, a cancelled job
interrupted on the server, and bad arguments as tool errors. The same tools on the headless runner:
tests/agent/test_mcp_tools.py."""

from __future__ import annotations

import base64
import os
import sys

import anyio
import pytest
from comfyui_lane import COMFYUI_DIR, NO_COMFYUI, probe_mp4

pytest.importorskip("mcp", reason="the agent server needs the mcp extra (pip install -e '.[test]' has it)")

from mcp import Client, StdioServerParameters  # noqa: E402

from comfyui_h3.agent.mcp_server import build_server  # noqa: E402
from comfyui_h3.agent.runners import ServerRunner  # noqa: E402
from repo_paths import REPO  # noqa: E402

pytestmark = [pytest.mark.skipif(not COMFYUI_DIR, reason=NO_COMFYUI), pytest.mark.anyio]
SAMPLE = REPO / "comfyui_h3" / "sample_inputs" / "h3_demo_source.mp4"
FAST = {"loader": {"dtype": "float32"}, "steps": 2}


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def server(comfy):
    return build_server(ServerRunner(comfy.url))


async def test_jobs_run_on_comfyui_with_progress_files_and_manifests(comfy, server):
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, total, message))

    async with Client(server) as client:
        tools = {t.name: t.input_schema for t in (await client.list_tools()).tools}
        assert "tiny-h3 (built-in test model, makes noise)" in tools["generate"]["properties"]["model"]["enum"]
        up = await client.call_tool("upload_file", {"name": "mcp_clip.mp4",
                                                    "data_base64": base64.b64encode(SAMPLE.read_bytes()).decode()})
        assert not up.is_error, up.content[0].text
        stored = up.structured_content["name"]
        assert (comfy.input_dir / stored).read_bytes() == SAMPLE.read_bytes()
        gen = await client.call_tool("generate", {"prompt": "a kite over dunes", **FAST},
                                     progress_callback=on_progress)
        edit = await client.call_tool("edit", {"video": stored, "prompt": "an empty floor", "mask_text": "the square",
                                               **FAST})
        for result in (gen, edit):
            assert not result.is_error, comfy.why(result.content[0].text)
        (made,), (edited,) = gen.structured_content["files"], edit.structured_content["files"]
        read = await client.call_tool("read_output", {"filename": made["filename"], "subfolder": made["subfolder"]})
    on_disk = comfy.output_dir / made["subfolder"] / made["filename"]
    assert base64.b64decode(read.structured_content["data_base64"]) == on_disk.read_bytes()
    assert probe_mp4(str(on_disk))["frames"] == 124 and made["path"] is None
    assert made["manifest"]["request"]["task"] == "t2va" and edited["manifest"]["request"]["task"] == "edit"
    values = [p for p, _, _ in seen]
    assert values == sorted(values) and any("2/2" in (m or "") for _, _, m in seen)


async def test_a_cancelled_job_is_interrupted_on_comfyui_and_bad_arguments_are_tool_errors(comfy, server):
    async def cancel_at_first_step(progress, total, message):
        if "1/200" in (message or ""):
            scope.cancel()

    async with Client(server) as client:
        with anyio.CancelScope() as scope:
            await client.call_tool("generate", {"prompt": "x", **FAST, "steps": 200},
                                   progress_callback=cancel_at_first_step)
        assert scope.cancelled_caught
        for _ in range(120):  # the interrupt lands at the node's next step
            status, queue = comfy.request("/queue")
            if status == 200 and not queue["queue_running"] and not queue["queue_pending"]:
                break
            await anyio.sleep(0.5)
        assert not queue["queue_running"] and not queue["queue_pending"], comfy.why(str(queue))
        missing = await client.call_tool("edit", {"video": "nope.mp4", "prompt": "x", "mask_text": "cat"})
        outside = await client.call_tool("read_output", {"filename": "../comfyui.log"})
        after = await client.call_tool("generate", {"prompt": "y", **FAST})
    assert missing.is_error and "nope.mp4" in missing.content[0].text
    assert outside.is_error
    assert not after.is_error, comfy.why(after.content[0].text)


async def test_the_command_serves_comfyui_over_stdio(comfy):
    params = StdioServerParameters(command=sys.executable, args=["-m", "comfyui_h3", "mcp", "--server", comfy.url],
                                   env=dict(os.environ, PYTHONPATH=str(REPO)))
    async with Client(params) as client:
        listed = await client.call_tool("list_inputs", {})
    assert not listed.is_error and "h3_text_to_video" in listed.structured_content["workflows"]
