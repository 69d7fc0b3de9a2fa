"""H3's weight policy: the shared storage / placement (backend/runtime.py) plus H3's own two, the AdaLN tables and
how many DiT blocks stay on the device when the others stream."""

from __future__ import annotations

from dataclasses import dataclass

from ...runtime import WeightPolicy

# AdaLN modulation: "direct" projects every step from resident weights; "cache": per-step modulation tables built
# ahead on the device, the projection weights in (pinned) host memory (adaln_cache.py).
ADALN_MODES = ("direct", "cache")


@dataclass(frozen=True)
class H3WeightPolicy(WeightPolicy):
    adaln: str = "direct"
    resident_blocks: int | None = None  # placement "offload": DiT blocks kept on the device; None = auto

    @classmethod
    def of(cls, policy: WeightPolicy | None) -> "H3WeightPolicy":
        """An H3 policy from a shared one (H3's own fields at their defaults), or the policy itself."""
        if policy is None:
            return cls()
        if isinstance(policy, cls):
            return policy
        return cls(storage=policy.storage, placement=policy.placement)

    def validate(self) -> None:
        super().validate()
        if self.resident_blocks is not None and (self.placement != "offload" or isinstance(self.resident_blocks, bool)
                                                 or not isinstance(self.resident_blocks, int)
                                                 or self.resident_blocks < 0):
            raise ValueError(f"resident_blocks is a number >= 0 with placement 'offload' (None: auto), got "
                             f"{self.resident_blocks!r} with placement {self.placement!r}.")
        if self.adaln not in ADALN_MODES:
            raise ValueError(f"AdaLN mode must be one of {ADALN_MODES}, got {self.adaln!r}.")
