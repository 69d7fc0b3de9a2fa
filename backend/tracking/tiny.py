"""Tiny random SAM2 and SAM3 folders in the released transformers layout, built here (nothing is downloaded).

`make_tiny_sam2(folder)` / `make_tiny_sam3(folder)` write config.json, model.safetensors (``save_pretrained``) and the
processor files the processors load (processor_config.json; for SAM3 the CLIP tokenizer's files, a byte-level BPE
built locally). The weights are RANDOM: these models segment nothing meaningful. They exist so that the tests, the
demo and the shipped Track Mask workflows run every code path of H3 Track Mask anywhere, on a CPU, in seconds.

What is kept real: the model types (``sam2_video``, ``sam3_video``), the processors' classes, the prompt / mask
plumbing, the memory encoder's 64 output channels (transformers' memory attention reads 64-channel memories) and
a hidden width twice that (its object pointers split into memory-width tokens). What is tiny: the input size (SAM2
128 px instead of 1024, SAM3 112 instead of 1008), every width and depth. The SAM3 set's detection thresholds are 0,
so its random detector reports objects and a text prompt yields a (meaningless) non-empty mask.

Determinism: each model is built under its own seed (the caller's RNG state is left as it was); two builds with the
same library versions give the same weights.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

SAM2_SIZE = 128  # input square of the tiny SAM2 (the release: 1024)
SAM3_SIZE, SAM3_PATCH = 112, 14  # the tiny SAM3's input square and ViT patch (the release: 1008, 14)
WIDTH = 128  # hidden width (2 x the fixed 64-channel memory)
SAM2_SEED, SAM3_SEED = 1234, 4321
TOKENIZER_WORDS = ("the", "a", "red", "car", "person", "dog", "cat", "ball", "man", "woman", "object")


def _sam2_config():
    from transformers import Sam2VideoConfig

    size = SAM2_SIZE
    return Sam2VideoConfig(
        vision_config=dict(
            model_type="sam2_vision_model",
            backbone_config=dict(
                model_type="sam2_hiera_det_model", hidden_size=16, num_attention_heads=1, image_size=[size, size],
                blocks_per_stage=[1, 2, 2, 1], embed_dim_per_stage=[16, 32, 64, 128],
                num_attention_heads_per_stage=[1, 1, 1, 1], window_size_per_stage=[4, 4, 4, 4],
                global_attention_blocks=[4], window_positional_embedding_background_size=[2, 2]),
            backbone_channel_list=[128, 64, 32, 16],
            backbone_feature_sizes=[[size // 4] * 2, [size // 8] * 2, [size // 16] * 2],
            fpn_hidden_size=WIDTH),
        prompt_encoder_config=dict(hidden_size=WIDTH, image_size=size, patch_size=16),
        mask_decoder_config=dict(hidden_size=WIDTH, mlp_dim=64, num_attention_heads=2, iou_head_hidden_dim=32),
        image_size=size, num_maskmem=3,
        memory_attention_hidden_size=WIDTH, memory_attention_num_layers=1,
        memory_attention_feed_forward_hidden_size=64, memory_attention_rope_feat_sizes=[size // 16] * 2,
        memory_encoder_hidden_size=WIDTH, memory_encoder_output_channels=64,
        mask_downsampler_embed_dim=WIDTH, memory_fuser_embed_dim=WIDTH, memory_fuser_intermediate_dim=64,
        memory_fuser_num_layers=1)


def _sam3_vision() -> dict:
    grid = SAM3_SIZE // SAM3_PATCH
    return dict(
        model_type="sam3_vision_model",
        backbone_config=dict(model_type="sam3_vit_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=2, image_size=SAM3_SIZE, patch_size=SAM3_PATCH, window_size=4,
                             global_attn_indexes=[1], pretrain_image_size=SAM3_SIZE),
        fpn_hidden_size=WIDTH, backbone_feature_sizes=[[4 * grid] * 2, [2 * grid] * 2, [grid] * 2])


def _sam3_config(tokenizer):
    from transformers import Sam3VideoConfig

    grid = SAM3_SIZE // SAM3_PATCH
    special = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id)
    detector = dict(
        model_type="sam3", vision_config=_sam3_vision(),
        text_config=dict(model_type="clip_text_model", vocab_size=len(tokenizer), hidden_size=32,
                         intermediate_size=64, projection_dim=32, num_hidden_layers=1, num_attention_heads=2,
                         max_position_embeddings=32, **special),
        geometry_encoder_config=dict(hidden_size=WIDTH, num_layers=1, num_attention_heads=2, intermediate_size=64),
        detr_encoder_config=dict(hidden_size=WIDTH, num_layers=1, num_attention_heads=2, intermediate_size=64),
        detr_decoder_config=dict(hidden_size=WIDTH, num_layers=1, num_queries=8, num_attention_heads=2,
                                 intermediate_size=64),
        mask_decoder_config=dict(hidden_size=WIDTH, num_attention_heads=2))
    tracker = dict(
        model_type="sam3_tracker_video", vision_config=_sam3_vision(),
        prompt_encoder_config=dict(hidden_size=WIDTH, image_size=SAM3_SIZE, patch_size=SAM3_PATCH),
        mask_decoder_config=dict(hidden_size=WIDTH, mlp_dim=64, num_attention_heads=2, iou_head_hidden_dim=32),
        image_size=SAM3_SIZE, num_maskmem=3,
        memory_attention_hidden_size=WIDTH, memory_attention_num_layers=1,
        memory_attention_feed_forward_hidden_size=64, memory_attention_rope_feat_sizes=[grid, grid],
        memory_encoder_hidden_size=WIDTH, memory_encoder_output_channels=64,
        mask_downsampler_embed_dim=WIDTH, memory_fuser_embed_dim=WIDTH, memory_fuser_intermediate_dim=64,
        memory_fuser_num_layers=1)
    # thresholds 0: the random detector's every query counts, so a text prompt finds (meaningless) objects
    return Sam3VideoConfig(detector_config=detector, tracker_config=tracker, low_res_mask_size=4 * grid,
                           score_threshold_detection=0.0, new_det_thresh=0.0, high_conf_thresh=0.0)


def build_clip_tokenizer():
    """A CLIP tokenizer (byte-level BPE, words end in '</w>') over the 256 byte symbols plus merges for a few words:
    any text tokenizes, most of it byte by byte."""
    from transformers import CLIPTokenizer

    from ..models.tiny_tokenizer import byte_symbols

    symbols = byte_symbols()
    vocab: dict[str, int] = {}
    for symbol in symbols + [s + "</w>" for s in symbols]:
        vocab[symbol] = len(vocab)
    merges = []
    for word in TOKENIZER_WORDS:
        pieces = [symbols[b] for b in word.encode("utf-8")]
        pieces[-1] += "</w>"
        while len(pieces) > 1:
            merges.append((pieces[0], pieces[1]))
            pieces = [pieces[0] + pieces[1]] + pieces[2:]
            vocab.setdefault(pieces[0], len(vocab))
    for token in ("<|startoftext|>", "<|endoftext|>"):
        vocab[token] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=merges)


def _build(model_cls, config, seed: int, folder: Path) -> None:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config).eval()
    model.save_pretrained(str(folder))


def _fresh(folder, overwrite: bool) -> Path:
    folder = Path(folder)
    if folder.exists():
        if not overwrite:
            raise FileExistsError(f"{folder} exists; pass overwrite=True to replace it")
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def make_tiny_sam2(folder: str | os.PathLike, overwrite: bool = False) -> Path:
    """A tiny random SAM2 video folder (Sam2VideoModel + Sam2VideoProcessor files). Segments nothing meaningful."""
    from transformers import Sam2ImageProcessor, Sam2VideoModel, Sam2VideoProcessor
    from transformers.models.sam2_video.video_processing_sam2_video import Sam2VideoVideoProcessor

    folder = _fresh(folder, overwrite)
    _build(Sam2VideoModel, _sam2_config(), SAM2_SEED, folder)
    size = {"height": SAM2_SIZE, "width": SAM2_SIZE}
    image = Sam2ImageProcessor(size=size, mask_size={"height": SAM2_SIZE // 4, "width": SAM2_SIZE // 4})
    Sam2VideoProcessor(image_processor=image, video_processor=Sam2VideoVideoProcessor(size=size)) \
        .save_pretrained(str(folder))
    return folder


def make_tiny_sam3(folder: str | os.PathLike, overwrite: bool = False) -> Path:
    """A tiny random SAM3 video folder (Sam3VideoModel, whose tracker Sam3TrackerVideoModel also loads from it, +
    Sam3VideoProcessor with a CLIP tokenizer). Segments nothing meaningful."""
    from transformers import Sam3ImageProcessor, Sam3VideoModel, Sam3VideoProcessor
    from transformers.models.sam2_video.video_processing_sam2_video import Sam2VideoVideoProcessor

    folder = _fresh(folder, overwrite)
    tokenizer = build_clip_tokenizer()
    _build(Sam3VideoModel, _sam3_config(tokenizer), SAM3_SEED, folder)
    size = {"height": SAM3_SIZE, "width": SAM3_SIZE}
    image = Sam3ImageProcessor(size=size)
    video = Sam2VideoVideoProcessor(size=size, image_mean=image.image_mean, image_std=image.image_std)
    Sam3VideoProcessor(image_processor=image, video_processor=video, tokenizer=tokenizer).save_pretrained(str(folder))
    return folder
