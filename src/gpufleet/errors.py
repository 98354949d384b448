"""Typed errors: every user mistake is one of these, carrying what is wrong and what is allowed."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class GpufleetError(Exception):
    """Base of every error gpufleet raises on purpose; the CLI prints it as one line, exit 2."""


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
