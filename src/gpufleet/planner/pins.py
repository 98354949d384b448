"""Layout pins: what a user (`plan --tp 8 --pp 2,4 --vpp 1-4 ...`) or a published run fixes of a layout.

A pinned field holds one value, a tuple of values (try each), or a `ValueRange` (every value the search would try
anyway that lies inside it); a field left out (None) is the search's to choose. The search reads pins through
`pinned_choices`, so a run file's fields (`validate`), a stack's layout defaults (planner/stack.py) and the flags of
`plan` and `launch` narrow the same enumeration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from gpufleet.errors import InputError
from gpufleet.parallel.layout import RECOMPUTES, SHARDINGS

#: The most values one degree flag may list (the search multiplies them).
MAX_PINNED_VALUES = 64
#: The largest degree a flag may name (the largest GPU count `plan` takes).
MAX_DEGREE = 1_000_000


@dataclass(frozen=True)
class ValueRange:
    """Every candidate value from `low` to `high`, both included."""

    low: int
    high: int

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int) and self.low <= value <= self.high

    def __str__(self) -> str:
        return f"{self.low}-{self.high}"


Pin = Any  # one value, a tuple of values or a ValueRange (a plain alias: pins of different fields differ in type)


def pinned_choices(pin: Pin | None, values: Iterable[Any]) -> list[Any]:
    """The values the search tries for one field: `values` when the field is free, the pinned value or values
    when pinned, the `values` inside the range for a ValueRange."""
    if pin is None:
        return list(values)
    if isinstance(pin, ValueRange):
        return [value for value in values if value in pin]
    if isinstance(pin, tuple):
        return list(pin)
    return [pin]


@dataclass(frozen=True)
class LayoutPins:
    """The layout fields `plan` and `launch` may pin; None leaves a field to the search (and the stack's default)."""

    tp: Pin | None = None
    pp: Pin | None = None
    vpp: Pin | None = None
    cp: Pin | None = None
    ep: Pin | None = None
    expert_tp: Pin | None = None
    sharding: Pin | None = None
    micro_batch: Pin | None = None
    recompute: Pin | None = None

    def given(self) -> dict[str, Pin]:
        """The pinned fields, by Layout field name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def scalar(self, name: str) -> int | None:
        """The field's one pinned value, or None when it is free, a list or a range."""
        value = getattr(self, name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @classmethod
    def from_saved(cls, data: Any, where: str) -> LayoutPins:
        """The pins a plan file saved (dataclasses.asdict of LayoutPins: a range as {"low", "high"}, a list as a
        list); InputError naming `where` when the data is not that."""
        if not isinstance(data, dict) or not set(data) <= {f.name for f in fields(cls)}:
            raise InputError(f"{where} must be an object of layout fields, got {str(data)[:80]}")
        values: dict[str, Pin] = {}
        for name, value in data.items():
            if isinstance(value, dict) and set(value) == {"low", "high"}:
                values[name] = ValueRange(int(value["low"]), int(value["high"]))
            elif isinstance(value, list):
                values[name] = tuple(value)
            elif value is None or isinstance(value, int | str):
                values[name] = value
            else:
                raise InputError(f"{where}.{name} is not a layout pin: {str(value)[:80]}")
        return cls(**values)

    def describe(self) -> str:
        """`tp=8 pp=2,4 vpp=1-4`: the pins as a user typed them."""
        return " ".join(f"{name}={_spelled(value)}" for name, value in self.given().items())


def _spelled(value: Pin) -> str:
    return ",".join(str(item) for item in value) if isinstance(value, tuple) else str(value)


#: Flag -> Layout field, for the messages (the order `plan --help` lists them).
PIN_FLAGS: Mapping[str, str] = {"--tp": "tp", "--pp": "pp", "--vpp": "vpp", "--cp": "cp", "--ep": "ep",
                                "--etp": "expert_tp", "--micro-batch": "micro_batch", "--sharding": "sharding",
                                "--recompute": "recompute"}


def parse_degree_pin(text: str | None, flag: str) -> Pin | None:
    """`8`, `2,4,8` or `1-8` (a range, both ends included) as a pin of a positive whole degree."""
    if text is None:
        return None
    spelled = text.strip()
    if "-" in spelled and "," not in spelled:
        low_text, _, high_text = spelled.partition("-")
        low, high = _degree(low_text, flag, text), _degree(high_text, flag, text)
        if low > high:
            raise InputError(f"{flag} range {text!r} runs backwards: write the low end first, e.g. {high}-{low}")
        return ValueRange(low, high) if low != high else low
    items = spelled.split(",")
    if len(items) > MAX_PINNED_VALUES:
        raise InputError(f"{flag} lists {len(items)} values; at most {MAX_PINNED_VALUES}")
    values = tuple(dict.fromkeys(_degree(item, flag, text) for item in items))
    return values[0] if len(values) == 1 else values


def _degree(item: str, flag: str, text: str) -> int:
    item = item.strip()
    if not item.isdigit() or len(item) > len(str(MAX_DEGREE)) or not 1 <= int(item) <= MAX_DEGREE:
        raise InputError(f"{flag} takes whole numbers from 1 to {MAX_DEGREE:,}: one (8), a list (2,4,8) or a "
                         f"range (1-8), got {text!r}")
    return int(item)


def parse_choice_pin(text: str | None, flag: str, allowed: tuple[str, ...]) -> Pin | None:
    """One name or a comma-separated list of names out of `allowed`."""
    if text is None:
        return None
    values = tuple(dict.fromkeys(item.strip() for item in text.split(",")))
    unknown = [value for value in values if value not in allowed]
    if unknown or not values:
        raise InputError(f"{flag} takes one or more of {', '.join(allowed)} (comma-separated), got {text!r}")
    return values[0] if len(values) == 1 else values


SHARDING_NAMES: tuple[str, ...] = tuple(SHARDINGS)
RECOMPUTE_NAMES: tuple[str, ...] = tuple(RECOMPUTES)


def parse_pins(tp: str | None = None, pp: str | None = None, vpp: str | None = None, cp: str | None = None,
               ep: str | None = None, etp: str | None = None, micro_batch: str | None = None,
               sharding: str | None = None, recompute: str | None = None) -> LayoutPins:
    """LayoutPins from the flags' text (each None when the flag was not given)."""
    return LayoutPins(tp=parse_degree_pin(tp, "--tp"), pp=parse_degree_pin(pp, "--pp"),
                      vpp=parse_degree_pin(vpp, "--vpp"), cp=parse_degree_pin(cp, "--cp"),
                      ep=parse_degree_pin(ep, "--ep"), expert_tp=parse_degree_pin(etp, "--etp"),
                      micro_batch=parse_degree_pin(micro_batch, "--micro-batch"),
                      sharding=parse_choice_pin(sharding, "--sharding", SHARDING_NAMES),
                      recompute=parse_choice_pin(recompute, "--recompute", RECOMPUTE_NAMES))
