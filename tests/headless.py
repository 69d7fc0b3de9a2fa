"""Headless Chromium for the frontend tests: the browser, the skip marks for when it, node or the npm package
playwright-core (`npm ci` at the repo root) is missing, and a runner for the node scripts under tests/js/."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM = next((p for p in (os.environ.get("H3_CHROMIUM"), shutil.which("chromium"), shutil.which("chromium-browser"),
                              shutil.which("google-chrome")) if p), None)

NEEDS_BROWSER = [
    pytest.mark.skipif(shutil.which("node") is None, reason="node (Node.js) is not installed"),
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium executable (apt-get install chromium, or set H3_CHROMIUM)"),
    pytest.mark.skipif(not os.path.isdir(os.path.join(REPO, "node_modules", "playwright-core")),
                       reason="npm package playwright-core is not installed (run `npm ci` at the repo root)"),
]


def run_script(name: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`node tests/js/NAME CHROMIUM ARGS...` from the repo root, output captured as text."""
    return subprocess.run(["node", os.path.join(REPO, "tests", "js", name), CHROMIUM, *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)
