"""Write tests/fixtures/seedvr2_windows.json from the OFFICIAL SeedVR window code (run once, outside CI).

Usage (in a separate environment with torch, einops 0.7.0 and omegaconf 2.3.0; never the project venv's installs):
    python tools/make_seedvr2_window_goldens.py /path/to/SeedVR-checkout [--commit SHA] [--out ...]

The checkout (github.com/ByteDance-Seed/SeedVR) is imported from the given path and is never committed. For each
model (3B: configs_3b, 7B: configs_7b) the per-layer window counts and methods are read from its config; for each
token grid and each distinct (method, counts) the official window op gives the window list and the official
``na.window_idx`` (the permutation the attention layers use) gives the token order, recorded as its length, its
first entries and a sha256 of its little-endian int64 bytes.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from seedvr2_official import official_checkout  # noqa: E402 - tools/ is sys.path[0] for a script

# (T, H, W) token grids after patching: the plan's worked example, 720p/1080p/2x-of-H3 shapes, tiny grids, odd
# sizes, T = 1, grids with empty shifted windows dropped, portrait, a 30-frame cap case, a rounding edge case.
GRIDS = [
    (5, 45, 80),  # worked example: 17 frames of 720x1280
    (31, 45, 80),  # 121 frames of 720p
    (31, 68, 120),  # 1088x1920
    (21, 96, 168),  # 2x of 1344x768 (2688x1536); one empty shifted window per axis
    (1, 20, 36),  # T = 1 (an image)
    (3, 20, 36),
    (5, 20, 36),
    (10, 6, 8),  # empty shifted t window; tiny spatial
    (10, 45, 80),
    (3, 31, 17),  # portrait, cropped edges
    (9, 80, 45),  # portrait 16:9
    (33, 45, 80),  # T > 30: temporal window size capped
    (13, 37, 61),  # odd sizes
    (2, 3, 5),
    (1, 1, 1),
    (7, 1, 200),  # very wide
    (3, 9, 64),  # h * scale = 22.5 exactly: round half to even (22)
]


def _official(checkout: Path):
    sys.path.insert(0, str(checkout))
    import torch
    from omegaconf import OmegaConf

    from models.dit_v2 import na as na_v2
    from models.dit_v2.window import get_window_op as op_v2
    from models.dit import na as na_v1
    from models.dit.window import get_window_op as op_v1

    return torch, OmegaConf, {"dit": (op_v1, na_v1), "dit_v2": (op_v2, na_v2)}


def _model_settings(OmegaConf, checkout: Path, name: str):
    if not OmegaConf.has_resolver("eval"):
        OmegaConf.register_new_resolver("eval", eval)
    cfg = OmegaConf.load(checkout / f"configs_{name}" / "main.yaml")
    model = cfg.dit.model
    return {
        "module": str(model["__object__"].path),
        "num_layers": int(model.num_layers),
        "window": [list(w) for w in model.window],
        "window_method": list(model.window_method),
    }


def main() -> None:
    args, checkout, commit = official_checkout("seedvr2_windows.json")
    torch, OmegaConf, impls = _official(checkout)

    models = {name: _model_settings(OmegaConf, checkout, name) for name in ("3b", "7b")}
    cases = []
    for grid in GRIDS:
        case = {"grid": list(grid), "layouts": {}}
        for name, setting in models.items():
            pkg = setting["module"].split(".")[1]  # models.dit.nadit -> dit
            op_of, na = impls[pkg]
            for method, counts in sorted({(m, tuple(w)) for m, w in zip(setting["window_method"], setting["window"])}):
                op = op_of(method)
                wins = op(grid, counts)
                spans = [[s.start, s.stop, h.start, h.stop, w.start, w.stop] for s, h, w in wins]

                def make_window(x, op=op, counts=counts):  # the layers' call: slices of a (t, h, w, c) sample
                    return [x[a, b, c] for a, b, c in op(tuple(x.shape[:3]), counts)]

                partition, _, shapes, count = na.window_idx(torch.tensor([list(grid)]), make_window)
                perm = partition(torch.arange(grid[0] * grid[1] * grid[2]).unsqueeze(-1)).squeeze(-1).to(torch.int64)
                assert int(count[0]) == len(wins) and shapes.tolist() == [[b - a for a, b in zip(s[::2], s[1::2])] for s in spans]
                key = f"{method}|{','.join(map(str, counts))}"
                entry = {
                    "windows": spans,
                    "perm_len": perm.numel(),
                    "perm_head": perm[:16].tolist(),
                    "perm_sha256": hashlib.sha256(perm.numpy().astype("<i8").tobytes()).hexdigest(),
                }
                if key in case["layouts"]:
                    assert case["layouts"][key] == entry, f"{grid} {key}: 3B and 7B code disagree"
                else:
                    case["layouts"][key] = entry
        cases.append(case)

    out = {
        "source": "github.com/ByteDance-Seed/SeedVR",
        "commit": commit,
        "made_by": "tools/make_seedvr2_window_goldens.py",
        "models": models,
        "cases": cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    tmp.replace(args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, {len(cases)} grids)")


if __name__ == "__main__":
    main()
