"""Step caching for the H3 denoise driver: DiT forwards whose result barely changes are not computed in full.

The method is DBCache's (cache-dit, "Dual Block Cache", with its Fn front blocks and no back blocks: F<n>B0), which
follows First-Block Cache (ParaAttention) and TeaCache's observation that a step's output residual changes little
when the residual of its first blocks changes little:

  - every forward computes the first `front` blocks; their residual r_f = x_front - x_in (x_in: the embedded rows
    going into the blocks) is compared with r_f of the last step computed in full: relative L1,
    d = sum|r_f - r_f'| / sum|r_f'| (summed over every rank's rows under sequence parallelism, so all ranks decide
    alike);
  - d < threshold (and past the warm-up, and not more than `max_run` cached steps in a row): the other blocks are not
    run; their residual r_b = x_out - x_front is taken from the computed steps: the last one (order 0), or TaylorSeer's
    extrapolation of it (Liu et al. 2025, "From Reusing to Forecasting": finite differences over the last computed
    steps, order 1 or 2, in step index);
  - otherwise the remaining blocks run and r_f, r_b become the new references.
`every` > 0 is the fixed schedule instead (after the warm-up, compute every `every`-th step, reuse between; no
measure). Video and audio rows are one packed sequence: one decision covers both.

Settings (a request's `step_cache`): "off" (every forward, bit for bit the path without a cache), the presets below,
or a threshold as text ("0.1"). The presets are provisional: random weights make the residual criterion atypical,
so they will be tuned once trained weights can be measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from .geometry import RequestError


@dataclass(frozen=True)
class StepCacheSettings:
    threshold: float = 0.0  # relative L1 of the front residual below which a step reuses the rest (0: never)
    front: int = 8  # blocks every forward computes (DBCache's Fn)
    warmup: int = 6  # first steps always computed in full
    max_run: int = 3  # most consecutive cached steps (-1: no limit)
    order: int = 1  # TaylorSeer order of the reused residual (0: the last one as it is)
    every: int = 0  # > 0: the fixed schedule (compute every `every`-th step after the warm-up), no threshold

    @property
    def enabled(self) -> bool:
        return self.threshold > 0 or self.every > 0


PRESETS = {
    "quality": StepCacheSettings(threshold=0.05, front=8, warmup=8, max_run=2, order=1),
    "balanced": StepCacheSettings(threshold=0.1, front=8, warmup=6, max_run=3, order=1),
    "fast": StepCacheSettings(threshold=0.2, front=4, warmup=4, max_run=4, order=2),
}
CHOICES = ("off",) + tuple(PRESETS)


def parse(value: str | None) -> StepCacheSettings | None:
    """A request's `step_cache` -> its settings, None for off. A number is a threshold on the balanced preset's
    other settings; "every:K" the fixed schedule."""
    if value in (None, "", "off"):
        return None
    if value in PRESETS:
        return PRESETS[value]
    text = str(value).strip()
    try:
        if text.startswith("every:"):
            k = int(text[6:])
            if k < 2:
                raise ValueError
            return StepCacheSettings(every=k, warmup=PRESETS["balanced"].warmup, max_run=-1)
        threshold = float(text)
    except ValueError:
        raise RequestError(f"step_cache must be off, {', '.join(PRESETS)}, a threshold (e.g. 0.1) or every:K "
                           f"(K >= 2), got {value!r}.") from None
    if not 0 <= threshold <= 10:
        raise RequestError(f"step_cache threshold must be in 0..10 (0 = off), got {threshold:g}.")
    return None if threshold == 0 else replace(PRESETS["balanced"], threshold=threshold)


def rule(value) -> str | None:
    """The option's rule (options.SAMPLING): None, or what is wrong."""
    try:
        parse(value)
    except RequestError as exc:
        return str(exc)
    return None


@dataclass
class StepCache:
    """One request's cache (one plan of the denoise driver). `total(values)` sums floats over the ranks (SP)."""

    settings: StepCacheSettings
    blocks: int
    total: object = None
    computed: list[int] = field(default_factory=list)  # steps run in full
    cached: list[int] = field(default_factory=list)
    diffs: list[float | None] = field(default_factory=list)  # each step's measure (None: not measured)
    _front_ref: torch.Tensor | None = None
    _history: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (step, back residual), newest last
    _run: int = 0
    _step: int = -1

    def __post_init__(self):
        if self.blocks < 2 or self.settings.front < 1:
            raise RequestError(f"A step cache needs at least one front block and one after it; this DiT has "
                               f"{self.blocks} blocks, the settings ask {self.settings.front} in front.")

    @property
    def front(self) -> int:
        """The front blocks: the settings', at most all but one of this DiT's (a smaller fine-tune, the tiny set)."""
        return min(self.settings.front, self.blocks - 1)

    def begin(self, step: int) -> None:
        self._step = step

    def reuse(self, x_front: torch.Tensor, x_in: torch.Tensor) -> bool:
        """After the front blocks of the current step: whether to skip the rest (the decision, module docstring)."""
        s, i = self.settings, self._step
        front = x_front - x_in
        warm = i < s.warmup or not self._history
        if s.every > 0:
            diff, skip = None, not warm and (i - s.warmup) % s.every != 0
        else:
            diff = None
            if self._front_ref is not None:
                num = (front - self._front_ref).abs().sum(dtype=torch.float64)
                den = self._front_ref.abs().sum(dtype=torch.float64)
                num, den = (float(num), float(den)) if self.total is None else self.total([float(num), float(den)])
                diff = num / den if den > 0 else float("inf")
            skip = not warm and diff is not None and diff < s.threshold
        if skip and s.max_run >= 0 and self._run >= s.max_run:
            skip = False
        self.diffs.append(diff)
        if skip:
            self._run += 1
            self.cached.append(i)
        else:
            self._run = 0
            self.computed.append(i)
            self._front_ref = front
        return skip

    def back_residual(self) -> torch.Tensor:
        """The reused residual of the skipped blocks at the current step: TaylorSeer's extrapolation of the computed
        ones (finite differences in step index) up to the settings' order, as far as the history allows."""
        (k0, r0) = self._history[-1]
        order = min(self.settings.order, len(self._history) - 1)
        if order == 0:
            return r0
        dt = self._step - k0
        (k1, r1) = self._history[-2]
        d1 = (r0 - r1) / (k0 - k1)
        out = r0 + d1 * dt
        if order >= 2:
            (k2, r2) = self._history[-3]
            d1_prev = (r1 - r2) / (k1 - k2)
            d2 = (d1 - d1_prev) / ((k0 - k2) / 2)
            out = out + d2 * (dt * dt / 2)
        return out.to(r0.dtype)

    def remember(self, back: torch.Tensor) -> None:
        """After a step computed in full: its back residual x_out - x_front."""
        self._history.append((self._step, back))
        del self._history[:-(self.settings.order + 1)]

    def report(self) -> dict:
        return {"front_blocks": self.front, "threshold": self.settings.threshold, "every": self.settings.every,
                "order": self.settings.order, "forwards_computed": len(self.computed),
                "steps_cached": len(self.cached), "cached_steps": list(self.cached),
                "diffs": [None if d is None else round(d, 6) for d in self.diffs]}


def summary(reports: list[dict], timings: dict) -> dict | None:
    """The manifest's step_cache: each plan's report (an extension has one per window) and the totals, with the
    time per DiT forward actually computed (vLLM-Omni's reporting rule: per-step time divides by the forwards run)."""
    if not reports:
        return None
    computed = sum(r["forwards_computed"] for r in reports)
    cached = sum(r["steps_cached"] for r in reports)
    denoise_s = timings.get("denoise_s")
    return {"plans": reports, "sigma_points": computed + cached, "forwards_computed": computed,
            "steps_cached": cached,
            "seconds_per_forward": (denoise_s / computed) if isinstance(denoise_s, (int, float)) and computed else None}
