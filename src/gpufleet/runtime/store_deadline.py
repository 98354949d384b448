"""How long `ckpt upload`/`download` retry a store that does not answer: a module of its own, importable without the
runtime extra, so that the CLI can show the default before any store code is imported."""

from __future__ import annotations

DEFAULT_DEADLINE_S = 30.0
"""Judgement call: long enough to ride out a connection reset or a store's brief 5xx burst, short enough that a
script learns of an outage in well under a minute."""
