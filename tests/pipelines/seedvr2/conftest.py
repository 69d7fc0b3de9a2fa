"""Fixtures of the SeedVR2 pipeline tests."""

import pytest


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    """The tiny 3B SeedVR2 pipeline in float32 on the CPU (rank 0 of one), built once per module."""
    from comfyui_h3.backend.models.seedvr2.tiny import DIT_FILE, TEXT_FILE, VAE_FILE, make_tiny_seedvr2
    from comfyui_h3.backend.pipelines.seedvr2.family import seedvr2_config

    root = make_tiny_seedvr2(tmp_path_factory.mktemp("tiny") / "m", "3b")
    config = seedvr2_config(root / DIT_FILE.format(variant="3b"), root / VAE_FILE, root / TEXT_FILE,
                            dtype="float32", vae_dtype="float32")
    config.validate()
    return config.build_pipeline(0)
