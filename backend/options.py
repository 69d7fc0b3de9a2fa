"""A user-facing option, declared once: the node input, the CLI flag and the one rule that checks a value all come
from its `Option`. Each family declares its options in `pipelines/<family>/options.py`; the nodes, the CLI, the
engine config and the request read them from there.

Rules: `Option.error(value)` is the only check of a value (type, range, choices, then the option's own `rule`);
the boundary that builds a request or an engine config calls it once, and the layers below trust what passed.
`minimum` / `maximum` are inclusive; `step` only shapes the widget (ComfyUI does not enforce it). A rule that
relates two options (overlap below batch_frames) belongs to the request's `validate`, stated once there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping

from .errors import RequestError

UNSET = object()  # add_flag's "the option's own default"
KINDS = {"int": "INT", "float": "FLOAT", "bool": "BOOLEAN", "string": "STRING", "choice": None}


@dataclass(frozen=True)
class Option:
    """name: the node input's name (snake_case); kind: one of KINDS; default: the node's and the CLI's; tooltip:
    the node's text (the CLI's too unless `help` is given); choices: a "choice" option's values (a "string"
    option's: the list the node offers, its rule deciding what else passes), or a callable returning them (lists that depend on the installation, such as attention backends); rule: value -> None, or
    what is wrong, as a whole sentence; stage: who consumes it ("request": a field of the family's request of that
    name; "engine": the engine config builder; "node": the node, to build other fields); node: where the node lists
    it ("required", "optional" or "" for none; a node lists its group's options in declaration order, so a new
    option shows up without touching the node, appended after the ones saved workflows know); flag: the CLI flag ("" derives --name-with-dashes, None: no flag); label: how messages
    name it (default: the name, or the table's pattern); message: the sentence for a value out of range or not
    among the choices, a template of {label}, {value}, {range}, {minimum}, {maximum}; unset: the widget value that
    means "not given" (a shift's 0: the model folder's), which `value` turns into None and `error` passes, as it
    passes None; widget: extra V1 widget keys (multiline, ...)."""

    name: str
    kind: str
    default: Any
    tooltip: str
    minimum: float | None = None
    maximum: float | None = None
    step: float | None = None
    choices: tuple | Callable[[], Iterable] = ()
    rule: Callable[[Any], str | None] | None = None
    stage: str = "request"
    node: str = "required"
    flag: str | None = ""
    help: str = ""
    label: str = ""
    message: str = ""
    unset: Any = UNSET
    widget: Mapping = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"option {self.name}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.stage not in ("request", "engine", "node"):
            raise ValueError(f"option {self.name}: stage must be 'request', 'engine' or 'node', got {self.stage!r}")
        if self.node not in ("required", "optional", ""):
            raise ValueError(f"option {self.name}: node must be 'required', 'optional' or '', got {self.node!r}")

    def with_(self, **changes) -> "Option":
        """The same option with some fields changed (a node's own tooltip for a shared option)."""
        return replace(self, **changes)

    @property
    def values(self) -> tuple:
        """A choice option's values, in order."""
        return tuple(self.choices() if callable(self.choices) else self.choices)

    @property
    def cli_flag(self) -> str | None:
        return None if self.flag is None else (self.flag or "--" + self.name.replace("_", "-"))

    def range_text(self) -> str:
        """The allowed values in a few characters: "0..4097", "one of a, b", "" for free text / booleans."""
        if self.kind == "choice":
            return "one of " + ", ".join(map(str, self.values))
        if self.kind in ("int", "float") and (self.minimum is not None or self.maximum is not None):
            lo = "" if self.minimum is None else _number_text(self.minimum)
            hi = "" if self.maximum is None else _number_text(self.maximum)
            return f"{lo}..{hi}"
        return ""

    def value(self, given):
        """The request's value for a widget / flag value: None for the unset value, else `given`."""
        return None if self.is_unset(given) else given

    def is_unset(self, given) -> bool:
        return self.unset is not UNSET and (given is None or given == self.unset)

    def error(self, value) -> str | None:
        """None when `value` passes this option's one rule, else the sentence saying what to change."""
        label = self.label or self.name
        if self.is_unset(value):
            return None
        if self.kind in ("int", "float"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return f"{label} must be a number, got {value!r}."
            if not math.isfinite(value):
                return f"{label} must be a finite number, got {value}."
            if self.kind == "int" and not float(value).is_integer():
                return f"{label} must be a whole number, got {value!r}."
            if (self.minimum is not None and value < self.minimum) or (self.maximum is not None and value > self.maximum):
                return self._refusal(label, value)
        elif self.kind == "bool" and not isinstance(value, bool):
            return f"{label} must be true or false, got {value!r}."
        elif self.kind == "string" and not isinstance(value, str):
            return f"{label} must be text, got {type(value).__name__}."
        elif self.kind == "choice" and value not in self.values:
            return self._refusal(label, value)
        return self.rule(value) if self.rule is not None else None

    def _refusal(self, label: str, value) -> str:
        if self.message:
            return self.message.format(label=label, value=value, range=self.range_text(), minimum=self.minimum,
                                       maximum=self.maximum)
        if self.kind == "choice":
            return f"{label} must be {self.range_text()}, got {value!r}."
        return f"{label} must be in {self.range_text()}, got {_number_text(value)}."

    def check(self, value):
        """`value` when it passes, else RequestError with `error`'s sentence."""
        problem = self.error(value)
        if problem:
            raise RequestError(problem)
        return value

    def input_spec(self) -> tuple:
        """The V1 node input: (TYPE or the choice list, {default, min, max, step, tooltip, ...})."""
        spec: dict = {"default": self.default}
        if self.kind in ("int", "float"):
            spec.update({k: v for k, v in (("min", self.minimum), ("max", self.maximum), ("step", self.step))
                         if v is not None})
        spec.update(self.widget)
        spec["tooltip"] = self.tooltip
        # a "string" option with choices is offered as a list on the node (its rule may take more, e.g. on the CLI)
        listed = self.kind == "choice" or (self.kind == "string" and self.choices)
        return (list(self.values) if listed else KINDS[self.kind]), spec

    def add_flag(self, parser, default=UNSET, help: str | None = None, checked: bool = False, **extra) -> None:
        """The CLI flag, converted to the option's type as argparse reads it; the value is checked by `error` where
        the request or engine config is built (one rule, one line on the terminal), or, `checked`, by argparse as
        it reads the flag (for an engine option refused before any input is read). --help shows the range and the
        default. `default` / `help`: the CLI's own where they differ (e.g. None: "not given")."""
        text = help or self.help or self.tooltip
        rng = self.range_text() if self.kind in ("int", "float") else ""  # a choice's list: argparse shows it
        if rng and rng not in text:
            text += f" Range {rng}."
        if self.kind == "bool":  # on by default: --flag / --no-flag (argparse's pair); off: --flag alone
            import argparse

            on = self.default if default is UNSET else default
            action = argparse.BooleanOptionalAction if on else "store_true"
            parser.add_argument(self.cli_flag, dest=self.name, action=action, default=bool(on), help=text, **extra)
            return
        kwargs: dict = {"dest": self.name, "default": self.default if default is UNSET else default, "help": text}
        if self.kind == "choice" and "choices" not in extra:
            kwargs["choices"] = list(self.values)
        elif self.kind in ("int", "float"):
            kwargs["type"] = {"int": int, "float": float}[self.kind]
            kwargs["metavar"] = "N" if self.kind == "int" else "X"
        if checked:
            kwargs["type"] = self._checked_text
        kwargs.update(extra)
        parser.add_argument(self.cli_flag, **kwargs)

    def _checked_text(self, text: str):
        import argparse

        try:
            value = {"int": int, "float": float}.get(self.kind, str)(text)
        except ValueError:
            value = text
        problem = self.error(value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value


def _number_text(value) -> str:
    if value == 2**64 - 1:
        return "2^64-1"  # the seed's bound
    return f"{value:g}" if isinstance(value, float) else str(value)


class OptionTable:
    """A family's options by name, in declaration order (for a node's group: its widget order)."""

    def __init__(self, *options: Option, label: str = "{name}"):
        """`label`: how messages name an option that has no label of its own ("SeedVR2 Upscale's {name}")."""
        self._label = label
        self._options = {o.name: o if o.label else o.with_(label=label.format(name=o.name)) for o in options}
        if len(self._options) != len(options):
            raise ValueError("two options share a name")

    def __getitem__(self, name: str) -> Option:
        return self._options[name]

    def __iter__(self):
        return iter(self._options.values())

    def __contains__(self, name: str) -> bool:
        return name in self._options

    def adding(self, *options: Option) -> "OptionTable":
        """This table with `options` appended (a test's addition, or a family extending a shared table)."""
        return OptionTable(*self, *options, label=self._label)

    def names(self, stage: str | None = None) -> tuple:
        return tuple(o.name for o in self if stage is None or o.stage == stage)

    def inputs(self, *names: str, **overrides: Option) -> dict:
        """V1 node inputs for `names`, in that order; `overrides` replace an option for this node (its own
        tooltip)."""
        return {n: overrides.get(n, self[n]).input_spec() for n in names}

    def node_inputs(self, group: str, *first: str, **overrides: Option) -> dict:
        """V1 node inputs of a group ("required" / "optional"): `first` in that order (a node's saved widget order
        where it differs from the declaration's), then the group's other options in declaration order."""
        rest = [o.name for o in self if o.node == group and o.name not in first]
        return self.inputs(*first, *rest, **overrides)

    def add_flags(self, parser, *names: str, exclude: Iterable[str] = (), **defaults) -> None:
        """CLI flags for `names`, or with none named for every option that has a flag (in declaration order) but
        those in `exclude` (added by the caller in a form of its own); `defaults`: the CLI's own default of some."""
        skip = set(exclude)
        for option in ([self[n] for n in names] if names else [o for o in self if o.name not in skip]):
            if option.cli_flag is not None:
                option.add_flag(parser, default=defaults.get(option.name, UNSET))

    def check(self, values: Mapping[str, Any]) -> None:
        """RequestError with the first failing option's sentence, over the options named in `values`."""
        for name, value in values.items():
            self[name].check(value)

    def check_fields(self, request) -> None:
        """Each "request" option by its rule against the request's field of that name (None: not given)."""
        for option in self:
            if option.stage == "request" and hasattr(request, option.name):
                value = getattr(request, option.name)
                if value is not None:
                    option.check(value)


# Options every family shares
SEED = Option("seed", "int", 0, "Same seed and settings -> the same result.", minimum=0, maximum=2**64 - 1)


def parse_resident_blocks(value) -> tuple[str, int | None]:
    """A resident_blocks option -> (WeightPolicy.placement, WeightPolicy.resident_blocks): 'all' -> resident;
    'auto' -> offload, None; a whole number n >= 0 -> offload, n."""
    text = str(value).strip().lower()
    if text in ("", "all"):
        return "resident", None
    if text == "auto":
        return "offload", None
    if text.isdigit():
        return "offload", int(text)
    raise ValueError(f"resident_blocks must be 'all', 'auto' or a number of blocks >= 0, got {value!r}.")


def resident_blocks_rule(value) -> str | None:
    try:
        parse_resident_blocks(value)
    except ValueError as exc:
        return str(exc)
    return None


def resident_blocks_option(max_blocks: int, tooltip: str, help: str) -> Option:
    """A family's resident_blocks engine option (the WeightPolicy's placement and resident blocks): the node offers
    all, auto and 0..max_blocks (the largest released model's blocks); the CLI takes any whole number."""
    choices = ("all", "auto") + tuple(str(n) for n in range(max_blocks + 1))
    return Option("resident_blocks", "string", "all", tooltip, choices=choices, rule=resident_blocks_rule,
                  stage="engine", help=help)
