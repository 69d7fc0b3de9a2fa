"""pyproject lists every package an install needs (nodes/ and backend/ map under comfyui_h3), so `pip install .`
ships all of them with their data (templates, API workflows, sample inputs); the ComfyUI registry metadata and extras
are there; the folders ComfyUI lists as templates hold only UI workflows with thumbnails."""

import fnmatch
import json
import os
import tomllib
from repo_paths import REPO_DIR



def test_every_package_is_listed_and_mapped():
    with open(os.path.join(REPO_DIR, "pyproject.toml"), "rb") as handle:
        meta = tomllib.load(handle)
    setuptools = meta["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    mapping = setuptools["package-dir"]
    found = set()
    for top, name in (("comfyui_h3", "comfyui_h3"), ("nodes", "comfyui_h3.nodes"), ("backend", "comfyui_h3.backend")):
        for folder, _, files in os.walk(os.path.join(REPO_DIR, top)):
            if "__init__.py" in files and "__pycache__" not in folder:
                rel = os.path.relpath(folder, os.path.join(REPO_DIR, top))
                found.add(name if rel == "." else f"{name}.{rel.replace(os.sep, '.')}")
    assert found <= listed, f"packages missing from pyproject: {sorted(found - listed)}"
    assert mapping["comfyui_h3.nodes"] == "nodes" and mapping["comfyui_h3.backend"] == "backend"
    assert {"PublisherId", "DisplayName"} <= set(meta["tool"]["comfy"])
    assert {"test", "ray"} <= set(meta["project"]["optional-dependencies"])


# The folders ComfyUI's template browser lists (*/<folder>/*.json of each custom node; app/custom_node_manager.py).
COMFY_TEMPLATE_FOLDERS = ("example_workflows", "example", "examples", "workflow", "workflows")


def test_comfyui_lists_only_ui_workflows_each_with_a_thumbnail():
    from PIL import Image

    listed = [os.path.join(folder, name) for folder in COMFY_TEMPLATE_FOLDERS
              if os.path.isdir(os.path.join(REPO_DIR, folder)) for name in os.listdir(os.path.join(REPO_DIR, folder))
              if name.endswith(".json")]
    assert listed
    for rel in listed:
        with open(os.path.join(REPO_DIR, rel)) as handle:
            workflow = json.load(handle)
        # The API format ({id: {class_type, inputs}}) fails to open from the browser ("not a valid version").
        assert isinstance(workflow.get("nodes"), list) and "version" in workflow, f"{rel} is not a UI workflow"
        with Image.open(os.path.join(REPO_DIR, rel[:-5] + ".jpg")) as thumbnail:  # the card's image
            thumbnail.load()
            assert thumbnail.format == "JPEG" and thumbnail.size == (350, 350), rel


def test_templates_api_twins_and_sample_inputs_are_package_data():
    with open(os.path.join(REPO_DIR, "pyproject.toml"), "rb") as handle:
        setuptools = tomllib.load(handle)["tool"]["setuptools"]
    data = setuptools["package-data"]
    for package, folder in (("comfyui_h3.workflows", "example_workflows"), ("comfyui_h3", "comfyui_h3")):
        root = os.path.join(REPO_DIR, setuptools["package-dir"][package])
        assert setuptools["package-dir"][package] == folder
        wanted = [os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files
                  if package == "comfyui_h3.workflows" or os.path.basename(d) == "sample_inputs"]
        assert wanted
        for rel in wanted:
            assert any(fnmatch.fnmatch(rel.replace(os.sep, "/"), pattern) for pattern in data[package]), rel
