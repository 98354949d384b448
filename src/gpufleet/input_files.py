"""Reading the files a user hands gpufleet (--catalog, --runs, --plan): one owner of the checks made first.

Every such file must be a regular file (a named pipe would be read forever, /dev/null or a folder is not a
document) of at most MAX_INPUT_BYTES, UTF-8 text, nested at most MAX_NESTING_LEVELS deep. Each refusal is a
one-line typed error naming the file and what is allowed. `parse_yaml` and `parse_json` apply the same bounds to
text read some other way (a file on an object store).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from gpufleet.errors import GpufleetError, InputError
from gpufleet.fsio import FileTooLarge, NotARegularFile, read_regular_file
from gpufleet.units import format_bytes

#: The largest input file read (judgement: the largest shipped file, a run file, is ~150 KB; 16 MiB is 100x that,
#: and still parses in seconds, while a log or a disk image given by mistake is refused at once).
MAX_INPUT_BYTES = 16 * 2**20
#: The deepest nesting of lists and mappings accepted (judgement: catalog, run and plan files nest under 10 levels;
#: Python's parsers would overflow their stack near a few hundred).
MAX_NESTING_LEVELS = 100

def read_text(path: Path, what: str, error: type[GpufleetError] = InputError) -> str:
    """The UTF-8 text of `path`, refused in one line (`error`) unless it is a regular file of at most
    MAX_INPUT_BYTES (fsio.read_regular_file: opened without blocking and checked on the open descriptor, so a
    named pipe, even one swapped in after a check, never blocks)."""
    try:
        data = read_regular_file(path, MAX_INPUT_BYTES)
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist") from None
    except ValueError:  # a NUL character: no file can have that name
        raise error(f"{what} {str(path)!r} is not a file name (it holds a NUL character)") from None
    except NotARegularFile as problem:
        raise error(f"{what} {path} is {problem.kind}, not a regular file; give a file") from None
    except FileTooLarge as problem:
        if problem.grew:
            raise error(f"{what} {path} grew past {format_bytes(MAX_INPUT_BYTES)} while it was read") from None
        raise error(f"{what} {path} is {format_bytes(problem.size_bytes)}; at most {format_bytes(MAX_INPUT_BYTES)} "
                    "is read") from None
    except OSError as problem:
        raise error(f"cannot read {what} {path}: {problem.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as problem:
        raise error(f"{what} {path} is not UTF-8 text (byte {problem.start})") from None


class _TooDeep(Exception):
    pass


_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with nesting bounded at MAX_NESTING_LEVELS (its composer recurses once per level), and
    without YAML 1.1's implicit dates: `id: 2024-01-01` is the text 2024-01-01 (every date field of gpufleet's
    records is text, e.g. `as_of: "2026-03"`), never a datetime.date."""

    yaml_implicit_resolvers = {  # noqa: RUF012 (PyYAML reads it from the class, per loader class)
        first: [(tag, pattern) for tag, pattern in resolvers if tag != _TIMESTAMP_TAG]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_NESTING_LEVELS:
                raise _TooDeep
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _too_deep(name: Path | str, what: str, error: type[GpufleetError]) -> GpufleetError:
    return error(f"{what} {name} nests lists or mappings more than {MAX_NESTING_LEVELS} levels deep")


def load_yaml(path: Path, what: str, error: type[GpufleetError] = InputError) -> Any:
    """The YAML document in `path`: read_text's checks, then parse_yaml's."""
    return parse_yaml(read_text(path, what, error), path, what, error)


def parse_yaml(text: str, name: Path | str, what: str, error: type[GpufleetError] = InputError) -> Any:
    """The YAML document in `text` (read from `name`, a path or URL the message names); a syntax error or nesting
    deeper than MAX_NESTING_LEVELS becomes one line naming it (and the line, where YAML says)."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except (_TooDeep, RecursionError):
        raise _too_deep(name, what, error) from None
    except yaml.YAMLError as problem:
        mark = getattr(problem, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise error(f"{what} {name}{where} is not valid YAML") from None
    finally:
        loader.dispose()


def _depth(document: Any) -> int:
    """How deep lists and mappings nest in a parsed document (iterative: no recursion limit to meet)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def load_json(path: Path, what: str, hint: str = "", error: type[GpufleetError] = InputError) -> Any:
    """The JSON document in `path`: read_text's checks, then parse_json's."""
    return parse_json(read_text(path, what, error), path, what, hint, error)


def parse_json(text: str, name: Path | str, what: str, hint: str = "", error: type[GpufleetError] = InputError
               ) -> Any:
    """The JSON document in `text` (read from `name`, a path or URL the message names); anything but JSON, or
    nesting deeper than MAX_NESTING_LEVELS, becomes one line naming it (`hint` after it: what is expected)."""
    try:
        document = json.loads(text)
    except RecursionError:
        raise _too_deep(name, what, error) from None
    except ValueError:
        raise error(f"{what} {name} is not JSON{f'; {hint}' if hint else ''}") from None
    if _depth(document) > MAX_NESTING_LEVELS:
        raise _too_deep(name, what, error)
    return document
