"""What an H3 worker imports before it can load a model (backend/executor/worker_preload.py imports this module in
the workers' forkserver): diffusers' H3 VAE classes, transformers' Qwen3-VL, and our H3 pipeline."""

from diffusers.models.autoencoders import autoencoder_kl_minimax_h3, autoencoder_kl_minimax_h3_audio  # noqa: F401
from transformers.models.qwen2 import tokenization_qwen2  # noqa: F401
from transformers.models.qwen3_vl import modeling_qwen3_vl, processing_qwen3_vl  # noqa: F401

from . import components, pipeline  # noqa: F401
