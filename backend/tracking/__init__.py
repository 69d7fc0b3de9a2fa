"""Object tracking for H3 Track Mask: transformers' SAM2 video tracker and SAM3 text-prompted video segmentation,
driven (never re-implemented) to turn click / box / text prompts into a mask on every frame.

- sam_models.py: what a model folder is (SAM2 / SAM3, from its config.json), the device and dtype it runs in, and
  the process-wide cache of loaded models (one load per folder, device and dtype).
- sam_tracker.py: one tracking run: frames into an inference session, prompts in, forward and backward propagation,
  the union of the objects' masks at the video's size; Stop and progress per frame.
- tiny.py: tiny random SAM2 / SAM3 folders (transformers layout, processor and tokenizer files included) for the
  tests and the demo. They segment nothing meaningful.

The prompts' JSON lives in backend/media/track_prompts.py.
"""
