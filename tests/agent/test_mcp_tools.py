"""The MCP server (comfyui_h3/agent/) through the SDK's own client, on the headless runner and the tiny models: the
tools and their schemas, jobs with progress and their files and manifests, uploads and reads, a cancelled job, and
bad arguments as tool errors (the server keeps serving). The same client against a real ComfyUI:
tests/lane/test_comfyui_mcp.py."""

from __future__ import annotations

import base64
import json
import os
import sys

import anyio
import pytest

pytest.importorskip("mcp", reason="the agent server needs the mcp extra (pip install -e '.[test]' has it)")

from mcp import Client, StdioServerParameters  # noqa: E402

from comfyui_h3.agent.mcp_server import build_server  # noqa: E402
from comfyui_h3.agent.runners import LocalRunner  # noqa: E402
from repo_paths import REPO  # noqa: E402

pytestmark = pytest.mark.anyio
SAMPLE = REPO / "comfyui_h3" / "sample_inputs" / "h3_demo_source.mp4"
FAST = {"loader": {"dtype": "float32", "device": "cpu"}, "steps": 2}


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def folders(tmp_path, monkeypatch, tiny_h3_dir):
    monkeypatch.setenv("COMFYUI_H3_INPUT", str(tmp_path / "input"))
    monkeypatch.setenv("COMFYUI_H3_OUTPUT", str(tmp_path / "output"))
    monkeypatch.setenv("COMFYUI_H3_CACHE", str(tiny_h3_dir.parent))
    monkeypatch.delenv("COMFYUI_H3_TEMP", raising=False)
    (tmp_path / "input").mkdir()
    return tmp_path


@pytest.fixture
def server(folders):
    return build_server(LocalRunner())


def _progress_log():
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, total, message))

    return seen, on_progress


def _files(result):
    assert not result.is_error, result.content[0].text
    return result.structured_content["files"]


async def test_the_tools_and_their_schemas_come_from_the_nodes(server):
    async with Client(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {"generate", "edit", "extend", "upscale", "storyboard", "run_workflow", "upload_file",
                          "list_inputs", "read_output"}
    gen = tools["generate"].input_schema
    assert gen["required"] == ["prompt"] and gen["additionalProperties"] is False
    assert (gen["properties"]["steps"]["minimum"], gen["properties"]["steps"]["maximum"]) == (1, 1000)
    assert gen["properties"]["seconds"]["minimum"] == 5.0 and "turbo" in gen["properties"]["schedule"]["enum"]
    assert all(p.get("description") for p in gen["properties"].values())
    edit = tools["edit"].input_schema["properties"]
    assert edit["preset"]["enum"] == ["removal", "replace", "inpaint"] and "box" in edit and "mask_text" in edit
    assert "enum" not in edit["video"]  # a file of the input folder: checked when the job runs
    assert tools["upscale"].input_schema["properties"]["color_fix"]["default"] == "wavelet"


async def test_generate_reports_progress_and_returns_the_video_and_its_manifest(server, folders):
    seen, on_progress = _progress_log()
    async with Client(server) as client:
        result = await client.call_tool("generate", {"prompt": "rain on a tin roof", **FAST, "seed": 5},
                                        progress_callback=on_progress)
    (file,) = _files(result)
    assert file["filename"].endswith(".mp4") and file["subfolder"].startswith("H3/agent")
    assert os.path.isfile(file["path"]) and file["path"].startswith(str(folders / "output"))
    assert file["manifest"]["request"]["task"] == "t2va" and file["manifest"]["request"]["steps"] == 2
    assert file["manifest"]["request"]["seed"] == 5
    values = [p for p, _, _ in seen]
    assert values == sorted(values) and seen[-1][0] == seen[-1][1] == 3.0  # loader, sample, save
    assert any("H3 denoise: 2/2" in (m or "") for _, _, m in seen)


async def test_upload_then_edit_with_a_box_and_read_the_result(server, folders):
    data = SAMPLE.read_bytes()
    async with Client(server, mode="legacy") as client:  # the JSON-RPC loop, as over a transport
        up = await client.call_tool("upload_file", {"name": "clip.mp4",
                                                    "data_base64": base64.b64encode(data).decode()})
        assert up.structured_content == {"name": "clip.mp4", "bytes": len(data)}
        again = await client.call_tool("upload_file", {"name": "clip.mp4",
                                                       "data_base64": base64.b64encode(b"x").decode()})
        assert again.structured_content["name"] == "clip (1).mp4"  # never over a file
        listed = await client.call_tool("list_inputs", {})
        assert {"clip.mp4", "clip (1).mp4"} <= set(listed.structured_content["videos"])
        assert "h3_object_removal" in listed.structured_content["workflows"]
        result = await client.call_tool("edit", {"video": "clip.mp4", "prompt": "an empty floor", "preset": "removal",
                                                 "box": {"x": 0.1, "y": 0.2, "w": 0.3, "h": 0.4}, **FAST})
        (file,) = _files(result)
        read = await client.call_tool("read_output", {"filename": file["filename"], "subfolder": file["subfolder"]})
    assert (folders / "input" / "clip.mp4").read_bytes() == data
    assert file["manifest"]["request"]["task"] == "edit"
    with open(file["path"], "rb") as handle:
        assert base64.b64decode(read.structured_content["data_base64"]) == handle.read()


async def test_a_shipped_workflow_runs_with_overrides(server):
    async with Client(server) as client:
        result = await client.call_tool("run_workflow", {"workflow": "h3_text_to_video", "overrides": {
            "1.dtype": "float32", "2.steps": 2, "2.seed": 3, "3.filename_prefix": "H3/agent/shipped"}})
        bad = await client.call_tool("run_workflow", {"workflow": "h3_text_to_video", "overrides": {"2.nope": 1}})
    (file,) = _files(result)
    assert file["subfolder"] == "H3/agent" and file["filename"].startswith("shipped")
    assert file["manifest"]["request"]["seed"] == 3
    assert bad.is_error and "has no input 'nope'" in bad.content[0].text


@pytest.mark.parametrize("tool,arguments,reason", [
    ("generate", {"prompt": "x", "steps": 0}, "steps: 0 is less than the minimum of 1"),
    ("generate", {"prompt": "x", "seconds": 99}, "seconds: 99 is greater than the maximum of 15"),
    ("generate", {"prompt": "x", "colour": "red"}, "'colour' was unexpected"),
    ("generate", {"prompt": "x", "first_frame": "a.png", "reference_image": "b.png"}, "cannot be combined"),
    ("edit", {"video": "../../etc/passwd", "prompt": "x", "box": {"x": 0, "y": 0, "w": 1, "h": 1}}, "passwd"),
    ("edit", {"video": "missing.mp4", "prompt": "x", "mask_text": "cat"}, "missing.mp4"),
    ("edit", {"video": "a.mp4", "prompt": "x"}, "Give the mask one way"),
    ("upload_file", {"name": "../up.mp4", "data_base64": "eA=="}, "plain file name"),
    ("upload_file", {"name": "run.sh", "data_base64": "eA=="}, "uploads are media or workflow files"),
    ("read_output", {"filename": "../../secret.txt"}, "secret.txt"),
    ("run_workflow", {"workflow": "/etc/passwd.json"}, "passwd.json"),
    ("no_such_tool", {}, "Unknown tool"),
])
async def test_bad_arguments_are_tool_errors_and_the_server_goes_on(server, tool, arguments, reason):
    async with Client(server) as client:
        result = await client.call_tool(tool, arguments)
        assert result.is_error and reason in result.content[0].text, result.content[0].text
        listed = await client.call_tool("list_inputs", {})  # the same session still serves
    assert not listed.is_error


async def test_a_cancelled_job_stops_and_the_next_one_runs(server, folders):
    """Cancelling the call (the client's cancel scope) stops the run at its next step: nothing is saved, and the
    next call runs."""
    seen, on_progress = _progress_log()

    async def first_step_then_cancel(progress, total, message):
        await on_progress(progress, total, message)
        if "H3 denoise: 1/" in (message or ""):
            scope.cancel()

    async with Client(server) as client:
        with anyio.CancelScope() as scope:
            await client.call_tool("generate", {"prompt": "x", **FAST, "steps": 200},
                                   progress_callback=first_step_then_cancel)
        assert scope.cancelled_caught
        after = await client.call_tool("generate", {"prompt": "y", **FAST})
    assert not any("H3 denoise: 200/200" in (m or "") for _, _, m in seen)
    (file,) = _files(after)
    saved = [name for _, _, names in os.walk(folders / "output") for name in names if name.endswith(".mp4")]
    assert saved == [file["filename"]]


async def test_over_stdio_as_an_agent_starts_it(folders, tiny_h3_dir):
    """`python -m comfyui_h3 mcp` spawned by the SDK's stdio client: the tools list, and a call's answer."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    params = StdioServerParameters(command=sys.executable, args=["-m", "comfyui_h3", "mcp"], env=env,
                                   cwd=str(folders))
    async with Client(params) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        listed = await client.call_tool("list_inputs", {})
        bad = await client.call_tool("generate", {"prompt": "x", "steps": -1})
    assert "generate" in names and not listed.is_error and bad.is_error
    assert json.loads(json.dumps(listed.structured_content))["videos"] == []


async def test_a_storyboard_film_then_a_removal_on_its_second_shot(server, folders):
    """What the README's agent example asks for: a 3-shot film (cut, continue, cut), then H3 Edit on the second
    shot alone, read from the film by its `ref` and the shot's frames."""
    from cli_helpers import streams

    seen, on_progress = _progress_log()
    shots = [{"prompt": "a fox at the edge of a wood", "seconds": 5},
             {"prompt": "the fox trots into the clearing", "seconds": 5, "transition": "continue"},
             {"prompt": "an owl on a branch at night", "seconds": 5, "transition": "cut"}]
    async with Client(server) as client:
        film = await client.call_tool("storyboard", {"shots": shots, "width": 64, "height": 64, "seed": 4,
                                                     **FAST}, progress_callback=on_progress)
        (file,) = _files(film)
        report = film.structured_content["film"]
        second = report["shots"][1]
        edit = await client.call_tool("edit", {"video": file["ref"], "skip_first_frames": second["start_frame"],
                                               "frame_load_cap": second["frames"], "prompt": "the empty clearing",
                                               "mask_text": "the fox", **FAST})
    assert [(s["transition"], s["frames"], s["start_frame"]) for s in report["shots"]] == [
        ("cut", 124, 0), ("continue", 136, 124), ("cut", 124, 260)]
    assert streams(file["path"])[:2] == (384, 24.0) and report["frames"] == 384
    values = [p for p, _, _ in seen]
    assert values == sorted(values) and seen[-1][:2] == (3.0, 3.0)
    (edited,) = _files(edit)
    assert streams(edited["path"])[0] == 124  # the shot's 136 frames, cut down to 17n + 5


@pytest.mark.slow
def test_the_readme_agent_example_runs_on_the_tiny_models(folders, tiny_h3_dir):
    """examples/mcp_film_agent.py --tiny (the README's agent example) as a user runs it: the film and the edited
    second shot, both saved."""
    import subprocess

    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, str(REPO / "examples" / "mcp_film_agent.py"), "--tiny"], cwd=folders,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    for ref in result.values():
        name = ref.removesuffix(" [output]")
        assert (folders / "output" / name).is_file(), ref


async def test_over_streamable_http_on_loopback(folders):
    """`python -m comfyui_h3 mcp --http PORT`: the SDK's HTTP client lists the tools and gets a call's answer."""
    import socket
    import subprocess

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "comfyui_h3", "mcp", "--http", str(port)], cwd=folders, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(1200):  # the server's start (imports torch) on a busy machine: up to 2 min
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            await anyio.sleep(0.1)
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            names = {t.name for t in (await client.list_tools()).tools}
            listed = await client.call_tool("list_inputs", {})
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert {"generate", "storyboard"} <= names and not listed.is_error
