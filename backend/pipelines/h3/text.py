"""Text conditioning: MiniMax-H3's presentation of a request, encoded by Qwen3-VL (hidden_states[50]).

Presentation (no chat template, no special tokens):
  t2va:   prompt
  fl2va:  for each keyframe i: "<Picture i>: " + vision block; then prompt
  ref2va: per reference in order: "<Audio j>: " if it carries sound; image: "<Picture i>: " + vision block;
          video: "<Video k>: " then per merged frame pair "<{ts:.1f} seconds>" + vision block; then prompt
Vision block = <|vision_start|> + pad token * n + <|vision_end|>, tagged video (0); label/prompt tokens tagged text (1).
Output: embeds [1, Nt, text_hidden] and tags [Nt] long, row i of one is row i of the other.
"""

from __future__ import annotations

import numpy as np
import torch

from .geometry import TEXT_TAG, VIDEO_TAG, RequestError

TEXT_LAYER = 50
VIDEO_SAMPLE_FPS = 2.0  # video references are shown to the encoder at 2 fps


class Presentation:
    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.tags: list[int] = []

    def text(self, value: str) -> None:
        ids = self.tok(value, add_special_tokens=False)["input_ids"]
        self.ids += ids
        self.tags += [TEXT_TAG] * len(ids)

    def vision(self, pad_token: str, count: int) -> None:
        conv = self.tok.convert_tokens_to_ids
        ids = [conv("<|vision_start|>")] + [conv(pad_token)] * count + [conv("<|vision_end|>")]
        self.ids += ids
        self.tags += [VIDEO_TAG] * len(ids)


def sample_video_frames(frames: np.ndarray, fps: float, temporal_patch: int,
                        sample_fps: float = VIDEO_SAMPLE_FPS) -> tuple[list[np.ndarray], list[float]]:
    """Pick frames at sample_fps and the timestamp of each merged group of `temporal_patch` frames."""
    stride = fps / sample_fps
    picked, cursor = [], 0.0
    while round(cursor) < frames.shape[0]:
        if not picked or round(cursor) > picked[-1]:
            picked.append(round(cursor))
        cursor += stride
    if len(picked) < temporal_patch:
        need = round((temporal_patch - 1) * stride) + 1
        raise RequestError(f"A reference video must be at least {need} frames ({need / fps:.2g} s) long, "
                           f"got {frames.shape[0]}.")
    stamps = [i / sample_fps for i in range(len(picked))]
    stamps += [stamps[-1]] * (-len(stamps) % temporal_patch)
    groups = [(stamps[i] + stamps[i + temporal_patch - 1]) / 2 for i in range(0, len(stamps), temporal_patch)]
    return [frames[i] for i in picked], groups


class TextEncoder:
    """Owns the Qwen3-VL conditioner, its tokenizer and processor; turns presentations into embeddings."""

    def __init__(self, model, tokenizer, processor, device, dtype):
        layers = model.config.text_config.num_hidden_layers
        if layers < TEXT_LAYER:
            raise ValueError(f"MiniMax-H3 reads hidden_states[{TEXT_LAYER}] of Qwen3-VL; this text encoder has only "
                             f"{layers} decoder layers.")
        self.model, self.tok, self.processor = model, tokenizer, processor
        self.device, self.dtype = device, dtype

    @property
    def merge(self) -> int:
        return self.processor.image_processor.merge_size ** 2

    @torch.no_grad()
    def _encode(self, p: Presentation, vision: dict) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.tensor([p.ids], dtype=torch.long, device=self.device)
        mm_types = torch.tensor(self.processor.create_mm_token_type_ids([p.ids]), dtype=torch.long,
                                device=self.device)
        kwargs = {k: (v.to(self.device, self.model.dtype) if k.startswith("pixel_") else v.to(self.device))
                  for k, v in vision.items()}
        out = self.model.model(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=mm_types,
                               use_cache=False, output_hidden_states=True, **kwargs)
        return out.hidden_states[TEXT_LAYER].to(self.dtype), torch.tensor(p.tags, dtype=torch.long)

    def encode_prompt(self, prompt: str, keyframes: list | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """t2va (no keyframes) / fl2va (PIL keyframes already on the canvas, in packed order)."""
        p, vision = Presentation(self.tok), {}
        if keyframes:
            feats = self.processor.image_processor(images=keyframes, return_tensors="pt")
            vision = {"pixel_values": feats["pixel_values"], "image_grid_thw": feats["image_grid_thw"]}
            for i, grid in enumerate(feats["image_grid_thw"]):
                p.text(f"<Picture {i + 1}>: ")
                p.vision("<|image_pad|>", int(grid.prod()) // self.merge)
        p.text(prompt)
        return self._encode(p, vision)

    def encode_references(self, prompt: str, references: list) -> tuple[torch.Tensor, torch.Tensor]:
        """ref2va; `references` are normalised (conditioning.NormalizedReference) in request order."""
        vision: dict = {}
        image_counts: list[int] = []
        images = [r.image for r in references if r.kind == "image"]
        if images:
            feats = self.processor.image_processor(images=images, return_tensors="pt")
            vision["pixel_values"], vision["image_grid_thw"] = feats["pixel_values"], feats["image_grid_thw"]
            image_counts = [int(g.prod()) // self.merge for g in feats["image_grid_thw"]]
        video_counts, video_stamps = [], []
        videos = [r for r in references if r.kind == "video"]
        if videos:
            patch = self.processor.video_processor.temporal_patch_size
            sampled = [sample_video_frames(r.frames, r.fps, patch) for r in videos]
            feats = self.processor.video_processor(videos=[np.stack(f) for f, _ in sampled], do_sample_frames=False,
                                                   return_tensors="pt")
            vision["pixel_values_videos"], vision["video_grid_thw"] = feats["pixel_values_videos"], feats["video_grid_thw"]
            for (_, stamps), grid in zip(sampled, feats["video_grid_thw"]):
                if int(grid[0]) != len(stamps):
                    raise ValueError(f"Processor merged a reference video into {int(grid[0])} blocks, expected "
                                     f"{len(stamps)}.")
                video_counts.append(int(grid[1]) * int(grid[2]) // self.merge)
                video_stamps.append(stamps)
        p = Presentation(self.tok)
        n = {"image": 0, "video": 0, "audio": 0}
        for ref in references:
            if ref.has_audio:
                n["audio"] += 1
                p.text(f"<Audio {n['audio']}>: ")
            if ref.kind == "image":
                n["image"] += 1
                p.text(f"<Picture {n['image']}>: ")
                p.vision("<|image_pad|>", image_counts[n["image"] - 1])
            elif ref.kind == "video":
                n["video"] += 1
                p.text(f"<Video {n['video']}>: ")
                for stamp in video_stamps[n["video"] - 1]:
                    p.text(f"<{stamp:.1f} seconds>")
                    p.vision("<|video_pad|>", video_counts[n["video"] - 1])
        p.text(prompt)
        return self._encode(p, vision)
