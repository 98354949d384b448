"""Reading the files a user hands gpufleet (--catalog, --runs, --plan): one owner of the checks made first.

Every such file must be a regular file (a named pipe would be read forever, /dev/null or a folder is not a
document, a /proc or /sys file is the kernel's, not the user's) of at most MAX_INPUT_BYTES, UTF-8 text; its
document nests at most MAX_NESTING_LEVELS deep, names no key twice in one mapping (the line numbers are given),
holds no integer over MAX_INTEGER_DIGITS digits and no lone surrogate escape; a YAML document holds at most
MAX_YAML_NODES nodes (gpufleet.bounded_yaml). Each refusal is a one-line typed error naming the file and what is
allowed. `parse_yaml` and `parse_json` apply the same bounds to text read some other way (a file on an object
store).
"""

from __future__ import annotations

import errno
import json
import re
from pathlib import Path
from typing import Any

import yaml

from gpufleet import bounded_yaml
from gpufleet.bounded_yaml import MAX_INTEGER_DIGITS, MAX_NESTING_LEVELS, MAX_YAML_NODES
from gpufleet.errors import GpufleetError, InputError, shorten
from gpufleet.fsio import FileTooLarge, NotARegularFile, read_regular_file
from gpufleet.units import format_bytes

__all__ = ["MAX_INPUT_BYTES", "MAX_INTEGER_DIGITS", "MAX_NESTING_LEVELS", "MAX_YAML_NODES", "describe_os_error",
           "load_json", "load_yaml", "parse_json", "parse_yaml", "read_text"]

#: The largest input file read (judgement: the largest shipped file, a run file, is ~150 KB; 16 MiB is 100x that,
#: and still parses in seconds, while a log or a disk image given by mistake is refused at once).
MAX_INPUT_BYTES = 16 * 2**20


def describe_os_error(path: Path | str, problem: OSError) -> str:
    """What an OSError met opening `path` means, in words, after the path: a symbolic link loop is named as one
    (not as a missing file), a name too long says the limit, anything else gives the system's own words."""
    if problem.errno == errno.ELOOP:
        return "is a symbolic link loop (a link that leads back to itself): point it at a file"
    if problem.errno == errno.ENAMETOOLONG:
        return "has a name too long for the file system (255 bytes per name, 4,096 per path)"
    if problem.errno == errno.ENOENT:
        return "does not exist" if not Path(path).is_symlink() else "is a symbolic link to a file that does not exist"
    return f"cannot be read: {problem.strerror or problem}"


def read_text(path: Path, what: str, error: type[GpufleetError] = InputError) -> str:
    """The UTF-8 text of `path`, refused in one line (`error`) unless it is a regular file of at most
    MAX_INPUT_BYTES (fsio.read_regular_file: opened without blocking and checked on the open descriptor, so a
    named pipe, even one swapped in after a check, never blocks; a /proc or /sys file is refused unread)."""
    shown = shorten(str(path))
    try:
        data = read_regular_file(path, MAX_INPUT_BYTES)
    except ValueError:  # a NUL character: no file can have that name
        raise error(f"{what} {shorten(repr(str(path)))} is not a file name (it holds a NUL character)") from None
    except NotARegularFile as problem:
        raise error(f"{what} {shown} is {problem.kind}, not a regular file; give a file") from None
    except FileTooLarge as problem:
        if problem.grew:
            raise error(f"{what} {shown} grew past {format_bytes(MAX_INPUT_BYTES)} while it was read") from None
        raise error(f"{what} {shown} is {format_bytes(problem.size_bytes)}; at most {format_bytes(MAX_INPUT_BYTES)} "
                    "is read") from None
    except OSError as problem:
        raise error(f"{what} {shown} {describe_os_error(path, problem)}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as problem:
        raise error(f"{what} {shown} is not UTF-8 text (byte {problem.start})") from None


def load_yaml(path: Path, what: str, error: type[GpufleetError] = InputError) -> Any:
    """The YAML document in `path`: read_text's checks, then parse_yaml's."""
    return parse_yaml(read_text(path, what, error), path, what, error)


def parse_yaml(text: str, name: Path | str, what: str, error: type[GpufleetError] = InputError) -> Any:
    """The YAML document in `text` (read from `name`, a path or URL the message names); a syntax error, a character
    YAML does not allow (a NUL byte), or a bound of gpufleet.bounded_yaml broken becomes one line naming it (and
    the line, where YAML says)."""
    shown = shorten(str(name))
    try:
        return bounded_yaml.load(text)
    except bounded_yaml.Refused as problem:
        where = f" line {problem.line}" if problem.line is not None else ""
        raise error(f"{what} {shown}{where} {problem.message}") from None
    except RecursionError:
        raise error(f"{what} {shown} nests lists or mappings more than {MAX_NESTING_LEVELS} levels deep") from None
    except yaml.reader.ReaderError as problem:
        line = text.count("\n", 0, max(problem.position, 0)) + 1
        raise error(f"{what} {shown} line {line} holds the character #x{problem.character:04x}, which YAML does not "
                    "allow (a NUL byte or a control character: is it a text file?)") from None
    except yaml.YAMLError as problem:
        mark = getattr(problem, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise error(f"{what} {shown}{where} is not valid YAML") from None


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class _LongInteger(Exception):
    def __init__(self, digits: int) -> None:
        super().__init__(digits)
        self.digits = digits


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise _DuplicateKey(key)
        document[key] = value
    return document


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise _LongInteger(len(text.lstrip("-")))
    return int(text)


_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:,]')
_SURROGATE = re.compile("[\ud800-\udfff]")


def _json_key_lines(text: str, wanted: str) -> list[int]:
    """The lines where one JSON object gives the key `wanted` twice (the first object that does): a scan of the
    strings and brackets only, run when the parser found the duplicate (it does not say where)."""
    stack: list[dict[str, int] | None] = []  # per open bracket: the keys seen so far with their lines (objects)
    tokens = list(_JSON_TOKEN.finditer(text))
    for index, token in enumerate(tokens):
        word = token.group()
        if word in "{[":
            stack.append({} if word == "{" else None)
        elif word in "}]":
            if stack:
                stack.pop()
        elif word.startswith('"') and stack and stack[-1] is not None and index + 1 < len(tokens) \
                and tokens[index + 1].group() == ":" and json.loads(word) == wanted:
            line = text.count("\n", 0, token.start()) + 1
            if wanted in stack[-1]:
                return [stack[-1][wanted], line]
            stack[-1][wanted] = line
    return []


def _check_strings_and_depth(document: Any) -> str | None:
    """What is wrong with a parsed JSON document beyond syntax (iterative: no recursion limit to meet), or None:
    nesting deeper than MAX_NESTING_LEVELS, or a lone surrogate in a string."""
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            if level > MAX_NESTING_LEVELS:
                return f"nests lists or mappings more than {MAX_NESTING_LEVELS} levels deep"
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
        elif isinstance(item, str) and _SURROGATE.search(item):
            return "holds a lone surrogate escape (such as \\udc80), which is not a character"
    return None


def load_json(path: Path, what: str, hint: str = "", error: type[GpufleetError] = InputError) -> Any:
    """The JSON document in `path`: read_text's checks, then parse_json's."""
    return parse_json(read_text(path, what, error), path, what, hint, error)


def parse_json(text: str, name: Path | str, what: str, hint: str = "", error: type[GpufleetError] = InputError
               ) -> Any:
    """The JSON document in `text` (read from `name`, a path or URL the message names); anything but JSON, a key
    given twice in one object (with both lines), an integer over MAX_INTEGER_DIGITS digits, a lone surrogate, or
    nesting deeper than MAX_NESTING_LEVELS, becomes one line naming it (`hint` after it: what is expected)."""
    shown = shorten(str(name))
    try:
        document = json.loads(text, object_pairs_hook=_unique_pairs, parse_int=_bounded_int)
    except RecursionError:
        raise error(f"{what} {shown} nests lists or mappings more than {MAX_NESTING_LEVELS} levels deep") from None
    except _DuplicateKey as duplicate:
        lines = _json_key_lines(text, duplicate.key)
        where = f" (lines {lines[0]} and {lines[1]})" if lines else ""
        raise error(f"{what} {shown} gives the key {shorten(duplicate.key)!r} twice in one object{where}: "
                    "keep one") from None
    except _LongInteger as long:
        raise error(f"{what} {shown} holds an integer of {long.digits:,} digits; at most {MAX_INTEGER_DIGITS} are "
                    "read") from None
    except ValueError:
        raise error(f"{what} {shown} is not JSON{f'; {hint}' if hint else ''}") from None
    problem = _check_strings_and_depth(document)
    if problem is not None:
        raise error(f"{what} {shown} {problem}")
    return document
