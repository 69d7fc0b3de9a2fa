"""Draw the template-browser thumbnails of the shipped UI workflows: example_workflows/<name>.jpg beside <name>.json
(ComfyUI's template browser shows /api/workflow_templates/<pack>/<name>.jpg on each card).

    python tools/make_template_thumbnails.py

Each card is 350 x 350 (the size of ComfyUI's own template thumbnails): a picture of what the workflow does, made from
the pack's sample inputs (comfyui_h3/sample_inputs/) and the workflow's own mask drawing, above its title. The
"after" panels are illustrations (the tiny model the tests run makes noise), drawn from the same inputs.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from PIL import Image, ImageDraw, ImageFont

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from comfyui_h3.templates import BY_NAME  # noqa: E402  (each card's title and line, declared once)

TEMPLATES = os.path.join(REPO, "example_workflows")
SAMPLES = os.path.join(REPO, "comfyui_h3", "sample_inputs")
SIZE, PICTURE_H = 350, 226
BACKGROUND, INK, MUTED, ACCENT = (28, 30, 38), (236, 238, 244), (160, 166, 184), (255, 170, 60)



def font(size: int):
    return ImageFont.load_default(size=size)


def source_frames() -> np.ndarray:
    import av

    with av.open(os.path.join(SAMPLES, "h3_demo_source.mp4")) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def workflow_mask(name: str, frames: int, height: int, width: int) -> np.ndarray | None:
    from comfyui_h3.backend.media.mask_raster import render_state

    with open(os.path.join(TEMPLATES, f"{name}.json")) as handle:
        nodes = json.load(handle)["nodes"]
    draw = next((n for n in nodes if n["type"] == "H3_MaskDraw"), None)
    if draw is None:
        return None
    return render_state(draw["widgets_values"][0], frames, height, width).numpy()


def tint(frame: np.ndarray, mask: np.ndarray, color=(40, 200, 255), alpha=0.3) -> np.ndarray:
    """The mask lightly tinted over the frame, with a 2-px outline."""
    a = mask[..., None] * alpha
    out = (frame * (1 - a) + np.array(color) * a).round().astype(np.uint8)
    inside = mask > 0.5
    core = inside.copy()
    for axis in (0, 1):
        for shift in (-2, -1, 1, 2):
            core &= np.roll(inside, shift, axis=axis)
    out[inside & ~core] = color
    return out


def panel(pixels: np.ndarray, width: int) -> Image.Image:
    image = Image.fromarray(pixels)
    return image.resize((width, round(width * image.height / image.width)), Image.Resampling.NEAREST)


def floor(frame: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The frame with the masked square gone: the grey floor there (what removal is asked to make)."""
    out = frame.copy()
    out[mask > 0.5] = frame[2, 2]
    return out


def arrow(draw: ImageDraw.ImageDraw, x: int, y: int) -> None:
    draw.line([(x - 9, y), (x + 7, y)], fill=ACCENT, width=4)
    draw.polygon([(x + 11, y), (x + 3, y - 7), (x + 3, y + 7)], fill=ACCENT)


def before_after(card: Image.Image, before: np.ndarray, after: np.ndarray, labels=("source", "result"),
                 between: str | None = None) -> None:
    """Two panels with an arrow between them, or the text `between` (two results side by side)."""
    draw = ImageDraw.Draw(card)
    width = 154
    for k, (pixels, label) in enumerate(((before, labels[0]), (after, labels[1]))):
        x = 14 + k * (width + 14)
        image = panel(pixels, width)
        y = (PICTURE_H - image.height) // 2
        card.paste(image, (x, y))
        draw.text((x, y + image.height + 6), label, font=font(12), fill=MUTED)
    if between is None:
        arrow(draw, SIZE // 2, PICTURE_H // 2)
    else:
        draw.text((SIZE // 2, PICTURE_H // 2), between, font=font(12), fill=ACCENT, anchor="mm")


def film_strip(card: Image.Image, frames: list[np.ndarray], x0: int, width: int, y: int, hatch: int = 0) -> None:
    """Frames side by side on a strip; the last `hatch` cells are drawn as what is still to come."""
    draw = ImageDraw.Draw(card)
    cell = width // (len(frames) + hatch)
    height = round(cell * frames[0].shape[0] / frames[0].shape[1])
    draw.rectangle([x0 - 4, y - 10, x0 + cell * (len(frames) + hatch) + 3, y + height + 9], fill=(12, 12, 16))
    for k in range(len(frames) + hatch):
        x = x0 + k * cell
        if k < len(frames):
            card.paste(panel(frames[k], cell - 4), (x, y))
        else:
            draw.rectangle([x, y, x + cell - 5, y + height - 1], outline=ACCENT, width=2)
            for d in range(-height, cell, 9):
                draw.line([(x + max(d, 0), y + max(-d, 0)), (x + min(d + height, cell - 5), y + min(height, cell - 5 - d))],
                          fill=(110, 80, 40), width=1)
        for hole in range(x + 3, x + cell - 6, 9):
            draw.rectangle([hole, y - 7, hole + 4, y - 4], fill=(70, 70, 80))
            draw.rectangle([hole, y + height + 4, hole + 4, y + height + 7], fill=(70, 70, 80))


def waveform(card: Image.Image, y: int, x0: int = 24, x1: int = SIZE - 24) -> None:
    draw = ImageDraw.Draw(card)
    xs = np.arange(x0, x1, 3)
    amp = 10 + 8 * np.sin(xs / 23.0) * np.sin(xs / 7.0)
    for x, a in zip(xs, amp):
        draw.line([(x, y - a), (x, y + a)], fill=(90, 170, 230), width=2)


def scene(t: float) -> np.ndarray:
    """A small drawn scene for text-to-video (sun over waves), moving with t."""
    h, w = 96, 160
    y, x = np.mgrid[0:h, 0:w]
    sky = np.stack([40 + y * 1.2, 70 + y * 1.1, 140 + y * 0.6], axis=-1)
    sun = ((x - 40 - 60 * t) ** 2 + (y - 34) ** 2) < 150
    sky[sun] = (255, 200, 90)
    waves = y > 62 + 4 * np.sin(x / 9.0 + 6 * t)
    sky[waves] = (30, 90, 150)
    return sky.clip(0, 255).astype(np.uint8)


def track_prompts(name: str) -> tuple[dict, str]:
    """The workflow's H3 Track Mask prompts (decoded) and text."""
    with open(os.path.join(TEMPLATES, f"{name}.json")) as handle:
        node = next(n for n in json.load(handle)["nodes"] if n["type"] == "H3_TrackMask")
    values = node["widgets_values"]
    return (json.loads(values[1]) if values[1] else {"objects": []}), values[2]


def tracked(name: str, card: Image.Image, frames: np.ndarray) -> None:
    """A Track Mask workflow: its clicks / box (or its text) on the frame they are placed on, the object masked on
    that frame (the sample's red square: what a real SAM model finds), and the edit."""
    objects, text = track_prompts(name)
    marks = [(p["frame"], p) for o in objects["objects"] for p in o.get("points", []) + o.get("boxes", [])]
    at = marks[0][0] if marks else len(frames) // 2
    frame = frames[at]
    inside = np.abs(frame.astype(np.int32) - frame[2, 2]).sum(axis=-1) > 24  # all but the grey floor
    mask = (inside | np.roll(inside, 1, 0) | np.roll(inside, -1, 0) | np.roll(inside, 1, 1)
            | np.roll(inside, -1, 1)).astype(np.float32)
    after = floor(frame, mask)
    if "replacement" in name:
        y, x = np.mgrid[0:frame.shape[0], 0:frame.shape[1]]
        cy, cx = np.argwhere(mask > 0.5).mean(axis=0)
        after[((x - cx) ** 2 + (y - cy) ** 2) < 15 ** 2] = (60, 120, 255)
    before = tint(frame, mask)
    before_after(card, before, after, ("source + tracked mask", "edited"))
    draw = ImageDraw.Draw(card)
    scale = 154 / frame.shape[1]
    top = (PICTURE_H - round(frame.shape[0] * scale)) // 2
    for _, mark in marks:
        if "x0" in mark:
            draw.rectangle([14 + mark["x0"] * scale, top + mark["y0"] * scale, 14 + mark["x1"] * scale,
                            top + mark["y1"] * scale], outline=ACCENT, width=2)
        else:
            cx, cy = 14 + mark["x"] * scale, top + mark["y"] * scale
            color = (80, 230, 120) if mark.get("positive", True) else (255, 80, 80)
            draw.ellipse([cx - 4, cy - 4, cx + 4, cy + 4], fill=color, outline=INK)
    if text:
        draw.text((14, top - 22), f"\u201c{text}\u201d", font=font(14), fill=ACCENT)


def picture(name: str, card: Image.Image) -> None:
    frames = source_frames()
    middle = len(frames) // 2
    if name.endswith(("_clicks", "_text")):
        tracked(name, card, frames)
    elif name in ("h3_object_removal", "h3_object_replacement", "h3_inpainting"):
        mask = workflow_mask(name, len(frames), frames.shape[1], frames.shape[2])[middle]
        frame = frames[middle]
        if name == "h3_object_removal":
            after = floor(frame, mask)
        elif name == "h3_object_replacement":
            after = floor(frame, mask)
            y, x = np.mgrid[0:frame.shape[0], 0:frame.shape[1]]
            cy, cx = np.argwhere(mask > 0.5).mean(axis=0)
            after[((x - cx) ** 2 + (y - cy) ** 2) < 15 ** 2] = (60, 120, 255)
        else:
            after = frame.copy()
            after[mask > 0.5] = (150, 170, 200)  # the hole, filled (a patch of sky)
        before_after(card, tint(frame, mask), after, ("source + mask", "edited"))
    elif name == "h3_first_last_frame":
        first = np.asarray(Image.open(os.path.join(SAMPLES, "h3_demo_first.png")).convert("RGB"))
        last = np.asarray(Image.open(os.path.join(SAMPLES, "h3_demo_last.png")).convert("RGB"))
        before_after(card, first, last, ("first frame", "last frame"))
    elif name == "h3_extension":
        film_strip(card, [frames[k] for k in (0, 64, 129)], 20, 310, 70, hatch=2)
        ImageDraw.Draw(card).text((20 + 3 * 62, 150), "+ 20 s", font=font(16), fill=ACCENT)
        waveform(card, 190)
    elif name == "h3_generate_then_extend":
        film_strip(card, [scene(t) for t in (0.0, 0.5, 1.0)], 20, 310, 70, hatch=2)
        ImageDraw.Draw(card).text((20 + 3 * 62, 150), "+ 10 s", font=font(16), fill=ACCENT)
        waveform(card, 190)
    elif name == "h3_storyboard":
        film_strip(card, [scene(t) for t in (0.0, 0.4, 1.0)], 20, 310, 70)
        draw = ImageDraw.Draw(card)
        for k, label in enumerate(("cut", "continue", "cut")):
            draw.text((24 + k * 104, 150), label, font=font(14), fill=ACCENT)
        waveform(card, 190)
    elif name == "seedvr2_upscale_video":
        frame = frames[middle]
        from PIL import ImageFilter

        soft = np.asarray(Image.fromarray(frame).filter(ImageFilter.GaussianBlur(3)))  # what a low-res source shows
        before_after(card, soft, frame, ("source", "upscaled x2"))
    elif name == "h3_generate_then_upscale":
        before_after(card, scene(0.5)[::3, ::3], scene(0.5), ("generated", "upscaled x2"))
    elif name == "h3_extend_then_upscale":
        film_strip(card, [frames[k][::3, ::3] for k in (0, 64, 129)], 20, 310, 60, hatch=1)
        ImageDraw.Draw(card).text((20 + 3 * 78, 140), "+ 5 s, x2", font=font(16), fill=ACCENT)
        waveform(card, 190)
    elif name == "h3_native_sample_then_extend_upscale":  # ComfyUI's native sampler first, then ours
        film_strip(card, [scene(t)[::2, ::2] for t in (0.0, 0.5, 1.0)], 20, 310, 60, hatch=2)
        ImageDraw.Draw(card).text((20, 140), "native  ->  + 10 s, x2", font=font(16), fill=ACCENT)
        waveform(card, 190)
    elif name == "h3_sample_then_native_decode":
        film_strip(card, [scene(t) for t in (0.0, 0.5, 1.0)], 20, 310, 60)
        ImageDraw.Draw(card).text((20, 140), "LATENT  ->  native VAE decode", font=font(16), fill=ACCENT)
        waveform(card, 190)
    elif name == "h3_generate_then_refine":
        before_after(card, scene(0.5)[::2, ::2], scene(0.5), ("768p", "refined 1080p"))
    elif name == "h3_refine_vs_upscale":
        before_after(card, scene(0.5), scene(0.5), ("H3 Refine", "SeedVR2"), between="vs")
    elif name == "h3_video_restyle":
        frame = frames[middle]
        cool = (frame.astype(np.float32) * (0.55, 0.65, 1.0) + (20, 30, 60)).clip(0, 255).astype(np.uint8)
        before_after(card, frame, cool, ("source", "restyled"))
    elif name in ("h3_fasth3_text_to_video", "h3_turbo_text_to_video"):
        film_strip(card, [scene(t) for t in (0.0, 0.5, 1.0)], 20, 310, 60)
        label = "4 steps" if "fasth3" in name else "Turbo LoRA, 4 steps"
        ImageDraw.Draw(card).text((20, 150), label, font=font(16), fill=ACCENT)
        waveform(card, 190)
    else:  # text to video
        film_strip(card, [scene(t) for t in (0.0, 0.5, 1.0)], 20, 310, 60)
        waveform(card, 180)


def make_card(name: str) -> Image.Image:
    title, line = BY_NAME[name].title, BY_NAME[name].line
    card = Image.new("RGB", (SIZE, SIZE), BACKGROUND)
    picture(name, card)
    draw = ImageDraw.Draw(card)
    draw.rectangle([0, PICTURE_H + 8, SIZE, SIZE], fill=(38, 41, 52))
    draw.text((16, PICTURE_H + 20), title, font=font(26), fill=INK)
    draw.text((16, PICTURE_H + 60), line, font=font(13), fill=MUTED)
    draw.text((16, SIZE - 26), "MiniMax-H3  ·  comfyui-h3", font=font(12), fill=ACCENT)
    return card


def main(only: list[str] | None = None) -> int:
    """Every card, or those named on the command line."""
    names = only or sorted(f[:-5] for f in os.listdir(TEMPLATES) if f.endswith(".json"))
    missing = sorted(set(names) - set(BY_NAME))
    if missing:
        print(f"no card text for {missing}: add them to comfyui_h3/templates.py", file=sys.stderr)
        return 1
    for name in names:
        path = os.path.join(TEMPLATES, f"{name}.jpg")
        make_card(name).save(path, quality=88, optimize=True)
        print(f"{path}  {os.path.getsize(path) // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
