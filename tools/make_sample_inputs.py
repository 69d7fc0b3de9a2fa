"""Write the sample inputs the shipped workflows name (comfyui_h3/sample_inputs/; the pack copies them into ComfyUI's
input folder when it loads, and `python -m comfyui_h3 demo` into its own): two keyframes for first/last-frame (a
colour gradient and its mirror) and a 5.4-s source clip for the editing and extension workflows (a red square crossing
a grey floor, inside the workflows' mask boxes, over a 220 Hz tone).

    python tools/make_sample_inputs.py [--out DIR]

Existing files are replaced (this is the pack's own folder, not a user's). The files are committed; rerun this only to
change them, and keep them small.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from PIL import Image

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

FRAMES, HEIGHT, WIDTH, FPS, RATE = 130, 96, 192, 24, 32000


def keyframes() -> dict[str, np.ndarray]:
    y, x = np.mgrid[0:192, 0:336]
    base = np.stack([x * 255 // 335, y * 255 // 191, (x + y) * 255 // 526], axis=-1).astype(np.uint8)
    return {"h3_demo_first.png": base, "h3_demo_last.png": np.ascontiguousarray(base[:, ::-1, ::-1])}


def source_clip() -> tuple[np.ndarray, np.ndarray]:
    """(frames uint8 [130, 96, 192, 3], stereo tone float32 [2, N] at 32 kHz)."""
    frames = np.full((FRAMES, HEIGHT, WIDTH, 3), 110, np.uint8)
    for t in range(FRAMES):  # a 32-px square moving left to right, inside the workflows' mask boxes
        left = 12 + t * 136 // (FRAMES - 1)
        frames[t, 32:64, left:left + 32] = (220, 40, 40)
    tone = np.sin(2 * np.pi * 220 * np.arange(int(FRAMES / FPS * RATE)) / RATE).astype(np.float32) * 0.2
    return frames, np.stack([tone, tone])


def write_samples(out_dir: str) -> list[str]:
    from comfyui_h3.backend.media.save import write_mp4

    os.makedirs(out_dir, exist_ok=True)
    written = []
    for name, pixels in keyframes().items():
        path = os.path.join(out_dir, name)
        Image.fromarray(pixels).save(path, optimize=True)
        written.append(path)
    path = os.path.join(out_dir, "h3_demo_source.mp4")
    if os.path.exists(path):
        os.remove(path)
    frames, wave = source_clip()
    write_mp4(path, frames, FPS, wave, RATE, crf=23, preset="slow")
    written.append(path)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(REPO, "comfyui_h3", "sample_inputs"))
    args = parser.parse_args()
    for path in write_samples(args.out):
        print(f"{path}  {os.path.getsize(path) // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
