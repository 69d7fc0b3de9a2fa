"""The integration lane's own tools (.ci/lane): the test selection (tests/lane_select.py), the verdict on a
combination's report (.ci/lane_report.py), and what the lane's page-error filter relies on."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from comfyui_lane import TEMPLATES, frontend_model_lookup
from repo_paths import REPO



def _pytest(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("COMFYUI_DIR", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests"), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "lane_select", "-p", "no:cacheprovider", *args],
                          cwd=str(REPO), env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_lane_only_keeps_exactly_the_tests_that_need_a_comfyui():
    """The `comfy` fixture, a fixture that gets it at run time (comfy_lane), or a skipif naming COMFYUI_DIR."""
    run = _pytest("--collect-only", "-q", "--lane-only", "tests/cli/test_workflow_validation.py",
                  "tests/nodes/test_track_mask.py", "tests/pipelines/h3/test_native_h3.py")
    assert run.returncode == 0, run.stdout + run.stderr
    kept = sorted(line for line in run.stdout.splitlines() if "::" in line)
    assert kept == ["tests/cli/test_workflow_validation.py::test_verdicts_equal_a_real_comfyui",
                    "tests/nodes/test_track_mask.py::test_track_mask_in_a_real_comfyui",
                    "tests/pipelines/h3/test_native_h3.py::test_release_configs_take_comfyuis_own_qwen_tokenizer"], run.stdout


def test_lane_only_fails_when_nothing_needs_a_comfyui():
    run = _pytest("--collect-only", "-q", "--lane-only", "tests/lane/test_lane_tools.py")
    assert run.returncode != 0 and "none of the collected tests needs a real ComfyUI" in run.stderr, run.stderr


def _report(tmp_path, cases: str) -> subprocess.CompletedProcess:
    path = tmp_path / "report.xml"
    path.write_text(f'<testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
    return subprocess.run([sys.executable, str(REPO / ".ci" / "lane_report.py"), str(path)], capture_output=True,
                          text=True, timeout=60)


PASSED = '<testcase classname="tests.test_a" name="test_ok" file="tests/test_a.py" time="2.5"/>'


@pytest.mark.parametrize("cases, ok", [
    (PASSED, True),
    (PASSED + '<testcase classname="tests.test_b" name="test_gpu" file="tests/test_b.py" time="0">'
              '<skipped message="needs CUDA"/></testcase>', True),  # hardware the lane has not: allowed
    (PASSED + '<testcase classname="tests.test_b" name="test_ui" file="tests/test_b.py" time="0">'
              '<skipped message="no chromium executable (apt-get install chromium)"/></testcase>', False),
    (PASSED + '<testcase classname="tests.test_b" name="test_x" file="tests/test_b.py" time="0">'
              '<skipped message="COMFYUI_DIR is unset"/></testcase>', False),
    (PASSED + '<testcase classname="tests.test_b" name="test_bad" file="tests/test_b.py" time="1">'
              '<failure message="assert 0"/></testcase>', False),
    ('<testcase classname="tests.test_b" name="test_x" file="tests/test_b.py" time="0">'
     '<skipped message="needs CUDA"/></testcase>', False),  # nothing ran
    ("", False),
])
def test_a_combination_passes_only_when_its_tests_ran_and_passed(tmp_path, cases, ok):
    run = _report(tmp_path, cases)
    assert (run.returncode == 0) is ok, run.stdout + run.stderr


def test_shipped_workflows_name_no_url():
    """The lane forgives page errors for refused look-ups on huggingface.co (the frontend checks the models of
    ComfyUI's own default graph); that is safe while no workflow of ours names a URL for the frontend to check."""
    for path in sorted(TEMPLATES.rglob("*.json")):
        assert "://" not in json.dumps(json.loads(path.read_text())), path
    refused = ("Connecting to 'https://huggingface.co/Comfy-Org/z_image_turbo/resolve/main/x.safetensors' violates "
               "the following Content Security Policy directive")
    assert frontend_model_lookup(refused)
    assert frontend_model_lookup("Fetch API cannot load https://huggingface.co/Comfy-Org/z_image_turbo/resolve/main/"
                                 "x.safetensors. Refused to connect because it violates the document's Content "
                                 "Security Policy.")
    assert not frontend_model_lookup("Connecting to 'https://api.comfy.org/nodes' violates the following Content "
                                     "Security Policy directive")
    assert not frontend_model_lookup("TypeError: cannot read properties of undefined")
