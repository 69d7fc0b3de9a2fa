"""H3's weight policy: the shared storage / placement / resident blocks (backend/runtime.py) plus H3's own, the AdaLN
tables."""

from __future__ import annotations

from dataclasses import dataclass

from ...runtime import WeightPolicy

# AdaLN modulation: "direct" projects every step from resident weights; "cache": per-step modulation tables built
# ahead on the device, the projection weights in (pinned) host memory (adaln_cache.py).
ADALN_MODES = ("direct", "cache")


@dataclass(frozen=True)
class H3WeightPolicy(WeightPolicy):
    adaln: str = "direct"

    @classmethod
    def of(cls, policy: WeightPolicy | None) -> "H3WeightPolicy":
        """An H3 policy from a shared one (H3's own fields at their defaults), or the policy itself."""
        if policy is None:
            return cls()
        if isinstance(policy, cls):
            return policy
        return cls(storage=policy.storage, placement=policy.placement, resident_blocks=policy.resident_blocks)

    def validate(self) -> None:
        super().validate()
        if self.adaln not in ADALN_MODES:
            raise ValueError(f"AdaLN mode must be one of {ADALN_MODES}, got {self.adaln!r}.")
