"""Typed errors: every user mistake is one of these, carrying what is wrong and what is allowed."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


class GpufleetError(Exception):
    """Base of every error gpufleet raises on purpose; the CLI prints it as one line, exit 2.

    Every one survives pickling (a process pool's worker raises it, the parent reads it): it is rebuilt from the
    arguments it was made with, so a subclass whose `__init__` takes other arguments than its message does not
    need its own `__reduce__`, and attributes set since (`__dict__`) come back too."""

    _made_with: tuple[tuple[Any, ...], dict[str, Any]]

    def __new__(cls, *args: Any, **kwargs: Any) -> GpufleetError:
        error = super().__new__(cls, *args)
        error._made_with = (args, kwargs)
        return error

    def __reduce__(self) -> tuple[Any, ...]:
        args, kwargs = self.__dict__.get("_made_with", (self.args, {}))
        return (_rebuild_error, (type(self), args, kwargs), self.__dict__)


def _rebuild_error(cls: type[GpufleetError], args: tuple[Any, ...], kwargs: dict[str, Any]) -> GpufleetError:
    return cls(*args, **kwargs)


class InputError(GpufleetError, ValueError):
    """A value the user gave is malformed or out of range."""


class UnknownNameError(GpufleetError, KeyError):
    """A catalog name that does not exist; carries the nearest known names."""

    def __init__(self, kind: str, name: str, known: Iterable[str]) -> None:
        self.kind = kind
        self.name = name
        self.known = sorted(known)
        self.nearest = difflib.get_close_matches(name, self.known, n=3, cutoff=0.6)
        super().__init__(str(self))

    def __str__(self) -> str:
        hint = f"; did you mean {', '.join(self.nearest)}?" if self.nearest else ""
        listing = ", ".join(self.known[:30]) + (" …" if len(self.known) > 30 else "")
        return f"unknown {self.kind} {self.name!r}{hint} (known: {listing})"


class CatalogError(GpufleetError, ValueError):
    """A catalog file (shipped or user-supplied) is malformed."""


class LayoutError(GpufleetError, ValueError):
    """A parallel layout breaks a constraint; `constraint` names which one."""

    def __init__(self, constraint: str, message: str) -> None:
        self.constraint = constraint
        super().__init__(message)


class NoLegalLayoutError(InputError):
    """The GPU count (with the batch) cannot be split into any legal layout: a count to change, not a check that
    failed (a memory limit is InfeasibleError)."""


class InfeasibleError(GpufleetError):
    """A request that is well-formed but cannot be satisfied (nothing fits, deadline unreachable)."""


#: The longest value quoted whole in a message (judgement: a long path or a list of ids fits; a 100 KB argument
#: pasted by mistake is shown by its two ends and its length).
MAX_QUOTED_CHARS = 200


def shorten(text: str, most_chars: int = MAX_QUOTED_CHARS) -> str:
    """`text` itself when it is at most `most_chars` long, else its two ends around '…' and its length, about
    `most_chars` in all: 'aaaa…zz (100,000 characters)'."""
    if len(text) <= most_chars:
        return text
    length = f" ({len(text):,} characters)"
    kept = max(most_chars - len(length) - 1, 2)
    head = kept * 2 // 3
    return f"{text[:head]}…{text[head - kept:]}{length}"


def describe_validation_error(error: Exception) -> str:
    """The first error of a pydantic ValidationError as one line, 'field: message (got VALUE)', the value
    shortened; the same for every record gpufleet validates (catalog entries, run files, the planner's own)."""
    details = error.errors() if hasattr(error, "errors") else []
    if not details:
        return shorten(" ".join(str(error).split()))
    first = details[0]
    location = ".".join(str(part) for part in first.get("loc", ()))
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    value = first.get("input")
    shown = "" if isinstance(value, dict | list) or first.get("type") == "missing" else f" (got {shorten(repr(value))})"
    more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
    return f"{location + ': ' if location else ''}{message}{shown}{more}"
