"""Write every registered node's INPUT_TYPES (names, order, types, defaults, ranges, tooltips) as JSON: the
fixture tests/fixtures/node_inputs_de4eda1.json was made by running this on commit de4eda1, the last commit before the
options were declared once (backend/options.py), so tests/nodes/test_options.py can show saved workflows meet the same
widgets. Usage: python tools/dump_node_inputs.py REPO_CHECKOUT OUT.json (the checkout's code is imported)."""

from __future__ import annotations

import json
import os
import sys


def node_inputs() -> dict:
    from comfyui_h3.registration import NODE_CLASS_MAPPINGS

    def entry(value) -> list:  # ("INT", {...}) / (["a", "b"], {...}) / "UNIQUE_ID" (a hidden input)
        if isinstance(value, str):
            return [value, {}]
        kind, *rest = value
        return [kind if isinstance(kind, str) else list(kind), dict(rest[0]) if rest else {}]

    return {name: {group: {key: entry(value) for key, value in inputs.items()}
                   for group, inputs in cls.INPUT_TYPES().items()}
            for name, cls in sorted(NODE_CLASS_MAPPINGS.items())}


def main(argv: list[str]) -> int:
    repo, target = argv
    sys.path.insert(0, os.path.abspath(repo))
    with open(target, "w") as f:
        json.dump(node_inputs(), f, indent=1, default=str)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
