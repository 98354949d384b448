"""PyYAML's safe loader, bounded for files a user hands gpufleet: nesting, nodes, integers, keys and characters.

`load(text)` returns the one document in `text` or raises `Refused` (a message and, where YAML can say, the line),
or a yaml.YAMLError for a syntax error. It parses with libyaml's C parser where PyYAML has it (the events), and
composes and constructs in Python, so that every bound below is checked as the document is built, before the
next node is even parsed:

* nesting at most MAX_NESTING_LEVELS deep (PyYAML's composer recurses once per level);
* at most MAX_YAML_NODES nodes, an alias counted as every node of what it repeats (parsing time grows with nodes,
  not bytes: 5 MB of 200,000 short records is over a million nodes; an alias bomb is billions);
* integers of at most MAX_INTEGER_DIGITS digits (Python refuses to read past 4,300 digits and no float holds one
  past 309);
* no key twice in one mapping (YAML says keys are unique; PyYAML would keep the last one silently);
* no lone surrogate (a `"\\udc80"` escape: not a character, and no file, terminal or JSON encoder takes it);
* no YAML 1.1 implicit dates: `id: 2024-01-01` is the text 2024-01-01 (every date field of gpufleet's records is
  text, e.g. `as_of: "2026-03"`), never a datetime.date.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

#: The deepest nesting of lists and mappings accepted (judgement: catalog, run and plan files nest under 10 levels;
#: Python's parsers would overflow their stack near a few hundred).
MAX_NESTING_LEVELS = 100
#: The most YAML nodes (scalars, lists, mappings; an alias counts as what it repeats) one file may hold (judgement:
#: the largest shipped file, vtrain_runs.yaml, holds ~10,000; 200,000 is 20x that and loads in a few seconds).
MAX_YAML_NODES = 200_000
#: The longest integer read, in digits (judgement: no count, size or rate needs more than 20; past 309 digits no
#: float can hold it, past 4,300 Python refuses to read it).
MAX_INTEGER_DIGITS = 100

_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_INT_TAG = "tag:yaml.org,2002:int"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_SURROGATE = re.compile("[\ud800-\udfff]")


class Refused(Exception):
    """The document breaks one of the bounds; `line` (1-based) where YAML can say, else None."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


class _BoundedResolver(Resolver):
    yaml_implicit_resolvers = {  # noqa: RUF012 (PyYAML reads it from the class, per resolver class)
        first: [(tag, pattern) for tag, pattern in resolvers if tag != _TIMESTAMP_TAG]
        for first, resolvers in Resolver.yaml_implicit_resolvers.items()
    }


class _BoundedComposer(Composer):
    """PyYAML's composer counting nodes and levels, and refusing surrogates as each scalar is composed."""

    def __init__(self) -> None:
        super().__init__()
        self._depth = 0
        self._nodes = 0
        self._anchor_sizes: dict[str, int] = {}

    def _spend(self, count: int, line: int | None) -> None:
        self._nodes += count
        if self._nodes > MAX_YAML_NODES:
            raise Refused(f"holds more than {MAX_YAML_NODES:,} YAML nodes (values, lists and mappings, an alias "
                          "counted as what it repeats), the most read", line)

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()  # type: ignore[attr-defined]  # the parser's, beside this class in _Loader
        line = int(event.start_mark.line) + 1 if event.start_mark is not None else None
        if isinstance(event, AliasEvent):
            self._spend(self._anchor_sizes.get(str(event.anchor), 1), line)
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_NESTING_LEVELS:
                raise Refused(f"nests lists or mappings more than {MAX_NESTING_LEVELS} levels deep", line)
            before = self._nodes
            self._spend(1, line)
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self._anchor_sizes[str(anchor)] = self._nodes - before
        if isinstance(node, ScalarNode) and _SURROGATE.search(node.value):
            raise Refused("holds a lone surrogate escape (such as \\udc80), which is not a character", _line(node))
        return node


class _BoundedConstructor(SafeConstructor):
    """The safe constructor refusing duplicate keys and integers too long to be a count."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[tuple[str, str], int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE_TAG:
                continue
            key = (key_node.tag, key_node.value)
            if key in seen:
                raise Refused(f"gives the key {key_node.value!r} twice in one mapping (lines {seen[key]} and "
                              f"{_line(key_node)}): keep one")
            seen[key] = _line(key_node)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        digits = sum(character.isdigit() for character in str(node.value))
        if digits > MAX_INTEGER_DIGITS:
            raise Refused(f"holds an integer of {digits:,} digits; at most {MAX_INTEGER_DIGITS} are read", _line(node))
        return super().construct_yaml_int(node)


_BoundedConstructor.add_constructor(_INT_TAG, _BoundedConstructor.construct_yaml_int)  # type: ignore[type-var]


def _fast_parser() -> Any:
    """libyaml's parser class (the same events as PyYAML's, several times faster), or None without libyaml."""
    try:
        return getattr(importlib.import_module("yaml.cyaml"), "CParser", None)
    except ImportError:  # pragma: no cover - PyYAML built without libyaml
        return None


def _loader_class() -> Any:
    """The loader: libyaml's parser where PyYAML has it, else PyYAML's own reader, scanner and parser; the bounded
    composer, constructor and resolver either way."""
    fast = _fast_parser()
    bounded = (_BoundedComposer, _BoundedConstructor, _BoundedResolver)
    parsing: tuple[Any, ...] = (fast,) if fast is not None else (Reader, Scanner, Parser)

    def __init__(self: Any, text: str) -> None:
        if fast is not None:
            fast.__init__(self, text)
        else:  # pragma: no cover - PyYAML built without libyaml
            Reader.__init__(self, text)
            Scanner.__init__(self)
            Parser.__init__(self)
        for part in bounded:
            part.__init__(self)

    return type("_Loader", (bounded[0], *parsing, *bounded[1:]), {"__init__": __init__})


_Loader = _loader_class()


def load(text: str) -> Any:
    """The single YAML document in `text`, within the bounds above (Refused), or a yaml.YAMLError."""
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as problem:  # libyaml's scanner stops at 1,000 levels before the composer sees them
        if "maximum nesting depth" not in str(problem.problem):
            raise
        raise Refused(f"nests lists or mappings more than {MAX_NESTING_LEVELS} levels deep", None) from None
    finally:
        loader.dispose()
