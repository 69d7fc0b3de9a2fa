"""One lane combination's JUnit report (pytest --junitxml, xunit1) as seconds per module, and its verdict: exit 1 when
no test ran, when any failed, or when a test was skipped for want of what the lane provides (a ComfyUI, the browser).
Skips for hardware the lane does not have (CUDA, several GPUs) are listed and allowed."""

from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ET

# A skip whose reason names one of these means the lane's own setup is broken: it would hide the tests.
LANE_PROVIDES = ("COMFYUI_DIR", "chromium", "playwright", "node (Node.js)", "torchaudio")


def main(path: str) -> int:
    root = ET.parse(path).getroot()
    cases = root.iter("testcase")
    seconds: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    bad = []
    for case in cases:
        module = case.get("file") or ".".join((case.get("classname") or "?").split(".")[:2])
        seconds[module] += float(case.get("time") or 0)
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = tag
                if tag == "skipped":
                    reason = node.get("message", "")
                    print(f"  skipped {case.get('classname')}::{case.get('name')}: {reason}")
                    if any(word in reason for word in LANE_PROVIDES):
                        bad.append(f"{case.get('name')} skipped: {reason}")
                break
        counts[module][outcome] += 1
    total = collections.Counter()
    for module in sorted(seconds):
        total.update(counts[module])
        summary = ", ".join(f"{n} {k}" for k, n in sorted(counts[module].items()))
        print(f"  {seconds[module]:7.1f} s  {module}  ({summary})")
    print(f"  {sum(seconds.values()):7.1f} s  in all")
    if not total["passed"]:
        bad.append("no test passed")
    if total["failure"] or total["error"]:
        bad.append(f"{total['failure']} failed, {total['error']} errors")
    for line in bad:
        print(f"lane: {path}: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
