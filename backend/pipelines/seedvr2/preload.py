"""What a SeedVR2 worker imports before it can load a model (the workers' forkserver imports this module)."""

from ...models.seedvr2 import checkpoints, dit, rope, vae, window_attention, windows  # noqa: F401
from . import components, pipeline  # noqa: F401
