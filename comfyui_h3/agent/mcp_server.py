"""`python -m comfyui_h3 mcp`: the pack's jobs as Model Context Protocol tools (the official SDK, `mcp` 2.x; the
optional extra comfyui-h3[mcp]), over stdio or streamable HTTP on loopback.

Tools: generate / edit / extend / upscale (jobs.py: typed arguments from the nodes' own declarations, the graph a
creator would wire), run_workflow (a shipped workflow or one in the input folder, with overrides), upload_file and
list_inputs (ComfyUI's input folder), read_output (a file the tools saved). Each job returns the saved files and
their stage manifests, reports progress as MCP progress notifications, and stops its run when the client cancels
the call (ComfyUI's interrupt). Every failure -- an argument out of range, a file outside the folders, a node's
refusal, a worker crash -- is a tool error with its reason; the server keeps serving. One job runs at a time; a
second call waits for it, as ComfyUI's queue would."""

from __future__ import annotations

import base64
import json
import math
import threading

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server

from .jobs import BY_NAME, JOBS, storyboard_plan
from .runners import LocalRunner, OutputFile, ServerRunner, check_upload_name
from .schema import ArgumentError, check_arguments

try:
    BaseExceptionGroup
except NameError:  # Python 3.10: anyio's backport
    from exceptiongroup import BaseExceptionGroup

SERVER_NAME = "comfyui-h3"
INSTRUCTIONS = ("MiniMax-H3 video + audio generation, editing (object removal / replacement / inpainting), "
                "extension and SeedVR2 upscaling. Put source files in ComfyUI's input folder with upload_file (or "
                "see list_inputs), then call generate / edit / extend / upscale; each returns the saved video(s) "
                "with their manifests; read_output fetches a saved file.")

RUN_WORKFLOW = {"type": "object", "additionalProperties": False, "required": ["workflow"], "properties": {
    "workflow": {"type": "string", "minLength": 1, "description": (
        "A shipped workflow's name (e.g. h3_object_removal_text; see the enum of names in list_inputs' result) or a "
        "workflow file (.json, UI or API format) in ComfyUI's input folder.")},
    "overrides": {"type": "object", "additionalProperties": True, "description": (
        "Inputs to change, {\"NODE_ID.INPUT\": value}, e.g. {\"2.prompt\": \"a boat at dusk\", \"2.seed\": 7}.")}}}
UPLOAD = {"type": "object", "additionalProperties": False, "required": ["name", "data_base64"], "properties": {
    "name": {"type": "string", "description": "The file's name in the input folder (a free name is chosen when "
                                              "taken: the reply says which)."},
    "data_base64": {"type": "string", "description": "The file's bytes, base64."}}}
READ_OUTPUT = {"type": "object", "additionalProperties": False, "required": ["filename"], "properties": {
    "filename": {"type": "string", "minLength": 1}, "subfolder": {"type": "string", "default": ""}}}
LIST_INPUTS = {"type": "object", "additionalProperties": False, "properties": {}}


def _text(text: str, structured: dict | None = None, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=structured,
                                is_error=error)


class H3Tools:
    """The tools over one runner (LocalRunner or ServerRunner)."""

    def __init__(self, runner):
        self.runner = runner
        self._one_job = anyio.Lock()

    # -- listing ----------------------------------------------------------------------------------------------------

    async def list_tools(self) -> list[types.Tool]:
        info = await anyio.to_thread.run_sync(self.runner.node_inputs)
        tools = [types.Tool(name=job.name, title=job.title, description=job.description,
                            input_schema=job.schema(info)) for job in JOBS]
        tools += [
            types.Tool(name="run_workflow", title="Run a workflow", input_schema=RUN_WORKFLOW, description=(
                "Run a workflow file with overrides: a shipped one by name, or one of yours from the input folder.")),
            types.Tool(name="upload_file", title="Upload a file", input_schema=UPLOAD,
                       description="Put a video / image / audio / workflow file into ComfyUI's input folder."),
            types.Tool(name="list_inputs", title="List input files", input_schema=LIST_INPUTS,
                       description="The files in ComfyUI's input folder the tools can use, and the shipped "
                                   "workflows' names."),
            types.Tool(name="read_output", title="Read an output file", input_schema=READ_OUTPUT,
                       description="A file a tool saved (in ComfyUI's output folder), base64."),
        ]
        return tools

    # -- calling ----------------------------------------------------------------------------------------------------

    async def call(self, name: str, arguments: dict, report) -> types.CallToolResult:
        try:
            if name in BY_NAME:
                info = await anyio.to_thread.run_sync(self.runner.node_inputs)
                job = BY_NAME[name]
                args = check_arguments(job.schema(info), arguments)
                prompt = job.build(args, info)
                extra = storyboard_plan(args) if name == "storyboard" else None  # refuses a bad list before the run
                return await self._run(lambda progress, stop: (self.runner.run(prompt, progress, stop), extra), report)
            if name == "run_workflow":
                args = check_arguments(RUN_WORKFLOW, arguments)
                prompt = await anyio.to_thread.run_sync(self._workflow, args["workflow"], args.get("overrides") or {})
                return await self._run(lambda progress, stop: (self.runner.run(prompt, progress, stop), None), report)
            if name == "upload_file":
                return await anyio.to_thread.run_sync(self._upload, check_arguments(UPLOAD, arguments))
            if name == "list_inputs":
                check_arguments(LIST_INPUTS, arguments)
                return await anyio.to_thread.run_sync(self._list_inputs)
            if name == "read_output":
                args = check_arguments(READ_OUTPUT, arguments)
                return await anyio.to_thread.run_sync(self._read, OutputFile(args["filename"], args["subfolder"]))
            return _text(f"Unknown tool: {name}", error=True)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:  # noqa: BLE001 - every failure is the caller's to read, never the server's end
            return _text(_reason(exc), error=True)

    async def _run(self, work, report) -> types.CallToolResult:
        """`work(progress, stop)` -> (files saved, extra report or None), in a worker thread."""
        stop = threading.Event()
        send, receive = anyio.create_memory_object_stream(max_buffer_size=math.inf)

        def progress(done: float, total: float, message: str) -> None:  # from the runner's thread
            try:
                anyio.from_thread.run_sync(send.send_nowait, (done, total, message))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, RuntimeError):
                pass

        async def forward_progress():
            async with receive:
                async for done, total, message in receive:
                    await report(done, total, message)

        watcher = anyio.CancelScope()

        async def stop_on_cancel():  # the client cancelled the call: the run stops at its next step
            with watcher:
                try:
                    await anyio.sleep_forever()
                finally:
                    if not stop.is_set() and not watcher.cancel_called:
                        stop.set()
                        self.runner.interrupt()

        async with self._one_job:
            async with anyio.create_task_group() as group:
                group.start_soon(stop_on_cancel)
                group.start_soon(forward_progress)
                try:
                    async with send:
                        files, extra = await anyio.to_thread.run_sync(work, progress, stop)
                finally:
                    await anyio.lowlevel.checkpoint_if_cancelled()  # a cancel that came meanwhile: raised here
                    watcher.cancel()
            records = []
            for file in files:
                manifest = await anyio.to_thread.run_sync(self.runner.manifest, file)
                ref = f"{file.subfolder}/{file.filename}" if file.subfolder else file.filename
                records.append({**file.record(), "ref": f"{ref} [output]", "path": self.runner.local_path(file),
                                "manifest": manifest})
        names = ", ".join(r["ref"] for r in records)
        structured = {"files": records} if extra is None else {"files": records, "film": extra}
        return _text(f"Saved {len(records)} file(s): {names or 'none'}.", structured)

    def _workflow(self, workflow: str, overrides: dict) -> dict:
        from .. import comfy_services as services
        from ..registration import NODE_CLASS_MAPPINGS
        from ..templates import workflows_dir
        from ..workflow_format import ui_to_api
        from ..workflow_runner import apply_overrides

        shipped = workflows_dir() / f"{workflow}.api.json"
        if "/" not in workflow and "\\" not in workflow and shipped.is_file():
            data = json.loads(shipped.read_text(encoding="utf-8"))
        else:
            if not workflow.lower().endswith(".json"):
                raise ArgumentError(f"{workflow!r} is no shipped workflow (see list_inputs) and no .json file.")
            if isinstance(self.runner, LocalRunner):
                path = services.resolve_in_directory(services.input_directory(), workflow, must_exist=True)
                with open(path, "rb") as handle:
                    data = json.loads(handle.read())
            else:
                data = json.loads(self.runner.read_input(workflow))
        if isinstance(data, dict) and "nodes" in data and "links" in data:
            data = ui_to_api(data, NODE_CLASS_MAPPINGS)
        if not isinstance(data, dict) or not all(isinstance(v, dict) and "class_type" in v for v in data.values()):
            raise ArgumentError(f"{workflow} is not a workflow (UI or API format).")
        items = [f"{key}={json.dumps(value)}" for key, value in overrides.items()]
        classes = NODE_CLASS_MAPPINGS if isinstance(self.runner, LocalRunner) else None
        return apply_overrides(data, items, classes)

    def _upload(self, args: dict) -> types.CallToolResult:
        name = check_upload_name(args["name"])
        try:
            data = base64.b64decode(args["data_base64"], validate=True)
        except ValueError:
            raise ArgumentError("data_base64 is not base64.") from None
        stored = self.runner.upload(name, data)
        return _text(f"Stored as {stored} in the input folder.", {"name": stored, "bytes": len(data)})

    def _list_inputs(self) -> types.CallToolResult:
        from ..templates import workflows_dir
        from .schema import input_spec

        info = self.runner.node_inputs()
        videos, _ = input_spec(info, "H3_LoadVideo", "video")
        images, _ = input_spec(info, "H3_LoadImage", "image")
        shipped = sorted(p.name[: -len(".api.json")] for p in workflows_dir().glob("*.api.json"))
        return _text(f"{len(videos)} videos, {len(images)} images in the input folder.",
                     {"videos": list(videos), "images": list(images), "workflows": shipped})

    def _read(self, file: OutputFile) -> types.CallToolResult:
        data = self.runner.read_output(file)
        return _text(f"{file.filename}: {len(data)} bytes.", {"filename": file.filename, "subfolder": file.subfolder,
                                                              "data_base64": base64.b64encode(data).decode()})


def _reason(exc: BaseException) -> str:
    from ..comfy_services import H3Interrupted
    from ..server_client import Stopped

    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:  # the run's own error, out of the task group
        exc = exc.exceptions[0]
    if isinstance(exc, (H3Interrupted, Stopped)):
        return "Stopped: the call was cancelled; nothing of the stopped run was saved as complete."
    text = str(exc).strip() or type(exc).__name__
    return text if isinstance(exc, (ArgumentError, ValueError, RuntimeError, FileNotFoundError)) \
        else f"{type(exc).__name__}: {text}"


def build_server(runner) -> Server:
    tools = H3Tools(runner)

    async def on_list_tools(ctx: ServerRequestContext, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=await tools.list_tools())

    async def on_call_tool(ctx: ServerRequestContext, params: types.CallToolRequestParams) -> types.CallToolResult:
        async def report(done: float, total: float, message: str) -> None:
            await ctx.session.report_progress(done, total, message)

        return await tools.call(params.name, dict(params.arguments or {}), report)

    server = Server(SERVER_NAME, instructions=INSTRUCTIONS, on_list_tools=on_list_tools, on_call_tool=on_call_tool)
    server.h3_tools = tools  # tests reach the runner through it
    return server


def make_runner(server_url: str | None):
    return ServerRunner(server_url) if server_url else LocalRunner()


def serve(server_url: str | None = None, http_port: int | None = None) -> None:
    """Serve until the client goes (stdio) or Ctrl-C (HTTP on 127.0.0.1:`http_port`, path /mcp)."""
    server = build_server(make_runner(server_url))
    if http_port is None:
        from mcp.server.stdio import stdio_server

        async def main() -> None:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())

        anyio.run(main)
        return
    import uvicorn

    app = server.streamable_http_app(host="127.0.0.1")
    uvicorn.run(app, host="127.0.0.1", port=int(http_port), log_level="warning")

