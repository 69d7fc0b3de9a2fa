"""Node registration: the one place that lists the pack's nodes. IDs carry the `H3_` pack prefix (no core node uses
it: core ships MiniMaxH3* and SeedVR2*) and never change once shipped."""

from __future__ import annotations

NODE_CLASS_MAPPINGS: dict = {}
NODE_DISPLAY_NAME_MAPPINGS: dict = {}
WEB_DIRECTORY = "./js"
