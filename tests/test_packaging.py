"""pyproject lists every package an install needs (nodes/ and backend/ map under comfyui_h3), so `pip install .`
ships all of them; and the ComfyUI registry metadata and extras are there."""

import os
import tomllib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_package_is_listed_and_mapped():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as handle:
        meta = tomllib.load(handle)
    setuptools = meta["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    mapping = setuptools["package-dir"]
    found = set()
    for top, name in (("comfyui_h3", "comfyui_h3"), ("nodes", "comfyui_h3.nodes"), ("backend", "comfyui_h3.backend")):
        for folder, _, files in os.walk(os.path.join(REPO, top)):
            if "__init__.py" in files and "__pycache__" not in folder:
                rel = os.path.relpath(folder, os.path.join(REPO, top))
                found.add(name if rel == "." else f"{name}.{rel.replace(os.sep, '.')}")
    assert found <= listed, f"packages missing from pyproject: {sorted(found - listed)}"
    assert mapping["comfyui_h3.nodes"] == "nodes" and mapping["comfyui_h3.backend"] == "backend"
    assert {"PublisherId", "DisplayName"} <= set(meta["tool"]["comfy"])
    assert {"test", "ray"} <= set(meta["project"]["optional-dependencies"])
