"""What every SeedVR2 golden-fixture script (tools/make_seedvr2_*_goldens.py) does first: take the path of a local
checkout of the official code (never committed), the official commit it is at, and an output path; and make the
checkout importable. The scripts run in a separate venv with the official code's own dependencies."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"


def official_checkout(fixture: str, description: str | None = None) -> tuple[argparse.Namespace, Path, str]:
    """(arguments, checkout, commit); the checkout is first on sys.path. `fixture`: the default output's file name
    under tests/fixtures/."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("checkout", type=Path)
    ap.add_argument("--commit", help="official commit of the checkout (default: git rev-parse HEAD in it)")
    ap.add_argument("--out", type=Path, default=FIXTURES / fixture)
    args = ap.parse_args()
    checkout = args.checkout.resolve()
    commit = args.commit or subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    if len(commit) != 40:
        sys.exit(f"cannot tell the official commit of {checkout}: pass --commit <40 hex digits>")
    sys.path.insert(0, str(checkout))
    return args, checkout, commit


def write_golden(dest: Path, tensors: dict, meta: dict, what: str = "") -> None:
    """Write a golden safetensors file whole or not at all (a temporary beside it, then renamed), and say so."""
    from safetensors.torch import save_file

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(dest)
    print(f"wrote {dest} ({dest.stat().st_size} bytes{what})")
