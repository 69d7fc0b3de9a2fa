"""The H3 tasks, one module each; pipeline.TASKS dispatches a request to its `run_*`. Each task validates and sizes
its request, builds its step plan (step_plan.py), runs it through the one denoise driver (denoise.py) and decodes:
- generate.py: t2va, fl2va and ref2va (they differ only in their conditions: keyframes or references);
- edit.py: latent mask editing (per-row timesteps from the mask, anchors);
- extend.py: continuation window by window (guide rows, a streamed output on rank 0).
"""
