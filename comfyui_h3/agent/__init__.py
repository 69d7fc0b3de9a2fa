"""The pack for agents: its jobs as typed tools (jobs.py) over one runner -- this process's headless runner or a
running ComfyUI (runners.py) -- served over the Model Context Protocol (mcp_server.py, `python -m comfyui_h3 mcp`;
the optional extra `comfyui-h3[mcp]`)."""
