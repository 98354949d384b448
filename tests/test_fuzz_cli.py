"""Fuzz every `gpufleet` subcommand with generated bad input (issue 23, item 6).

The commands are discovered from the typer app, so a command added later is fuzzed too: each one starts from a
baseline invocation (BASELINES below, else the first `gpufleet …` example of its --help) and every option and
argument in turn gets hostile values of its type (empty, negative, nan, 1e400, 40 nines, full-width digits, a
thousands separator, a 100 KB value, a named pipe, /dev/null, a folder, YAML and JSON nested 1,000 deep, a
binary file, a 16 MiB+1 sparse file, and issue 31's classes: a 5,000-digit integer, a NUL byte, a lone
surrogate, a duplicated key, an alias bomb, /proc/kmsg, a 300-byte file name, a symbolic link loop, …); then seeded
random invocations change several at once, run files and catalog files with one field changed (0, -1, 16385, inf,
a word, null, a list…) go to `validate --runs` and to commands that read the changed GPU, and the same files changed
as text (a 5,000-digit integer, a NUL byte, a duplicated line, a lone surrogate) and Megatron argument files with
degrees below 1 go to `validate`, `catalog list` and `launch --check`. The corpus is fixed (random.Random(SEED)):
the same invocations every run. A property-based test (hypothesis, seeded) draws more such damaged files and
checks that each is refused in one line naming the file.

Each invocation must end with exit 0, 1 or 2, print no traceback, end an exit 2 with one `error: ` line whose length
is bounded, and finish within INVOCATION_LIMIT_S. The corpus runs in-process through the real entry point
(`gpufleet.cli.main.run`, the console script's own function) for speed, and a smaller set (the named pipes, the long
arguments, a seeded sample of the rest) as real subprocesses of the installed `gpufleet` script with a timeout.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import os
import random
import re
import shlex
import signal
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clirun import ENV_VAR, run_gpufleet
from gpufleet.catalog import registry
from gpufleet.cli.main import build_app, run
from gpufleet.cli.output import MAX_MESSAGE_CHARS
from gpufleet.input_files import MAX_INPUT_BYTES

SEED = 20261201
#: Longer than this is a hang (judgement: the slowest baseline takes about a second on a loaded 2-core machine).
INVOCATION_LIMIT_S = 20
#: Random invocations that change several options of one command at once.
RANDOM_INVOCATIONS = 200
#: How many of COMMON_VALUES each parameter gets (a seeded sample; the typed values and files come on top).
COMMON_PER_PARAMETER = 6
#: Real subprocesses drawn from the in-process corpus, on top of the named pipes and long arguments.
SUBPROCESS_SAMPLE = 8
LONG = "x" * 100_000
LONG_SPACED = "ab " * 33_000
#: More digits than Python reads as an integer (4,300): issue 31's first traceback class.
HUGE_DIGITS = "9" * 5000

#: Baselines that keep each invocation fast (a small search, one run to predict); a command not named here starts
#: from the first example of its --help. {tmp} is the test's folder.
BASELINES: dict[str, list[str]] = {
    "plan": ["-m", "llama3-8b", "-t", "1T", "-g", "h100-sxm", "-n", "8"],
    "validate": ["--runs", "{tmp}/one_run.yaml"],
    "fabric simulate": ["--gpus", "16", "--size", "1MiB"],
    "fabric build": ["--gpus", "64"],
    "memory": ["-m", "llama3-8b", "-g", "h100-sxm", "-n", "8", "--tp", "8"],
    "cost": ["--gpu-hours", "1e5", "--gpu", "h100-sxm"],
    "ckpt list": ["{tmp}/ckpt_root"],
    "ckpt verify": ["{tmp}/ckpt_root"],
    "ckpt prune": ["{tmp}/ckpt_root", "--keep-last", "2", "--dry-run"],
    "ckpt upload": ["{tmp}/ckpt_root", "{tmp}/ckpt_store"],
    "ckpt download": ["{tmp}/ckpt_store", "{tmp}/ckpt_root_copy"],
    "exporter": ["--fake-gpus", "2", "--once"],  # a server: one scrape to stdout, never a listening loop
}

#: Values every option and argument that takes one is given (a seeded sample of them, per parameter).
COMMON_VALUES = ["", " ", "-1", "0", "nan", "-inf", "1e400", "9" * 40, "１２８", "1,000", "1,024T", "0x10",
                 "é中🚀", "--json", "-", "true", "[1, 2]", "%s%n{0}", "../" * 40, "\t\n", "1e-400", "2**64"]
TYPED_VALUES = {
    "<int>": ["1.5", "18446744073709551617", "-0", "1_000", HUGE_DIGITS],
    "<int range>": ["1.5", "18446744073709551617", "-99999999999", HUGE_DIGITS],
    "<float>": ["1/3", "0.0", "-1e308", "1e308", HUGE_DIGITS],
    "<str>": [LONG, LONG_SPACED, HUGE_DIGITS],
}


@dataclass
class Leaf:
    """One subcommand: its words, the click command, and its parameters."""

    words: tuple[str, ...]
    command: Any
    options: list[Any] = field(default_factory=list)
    arguments: list[Any] = field(default_factory=list)

    @property
    def name(self) -> str:
        return " ".join(self.words)


def leaves() -> list[Leaf]:
    """Every subcommand of the app, discovered from typer (never listed by hand)."""
    found: list[Leaf] = []

    def walk(command: Any, words: tuple[str, ...]) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands:
            for name, sub in sorted(subcommands.items()):
                walk(sub, (*words, name))
            return
        leaf = Leaf(words, command)
        for param in command.params:
            (leaf.arguments if param.param_type_name == "argument" else leaf.options).append(param)
        found.append(leaf)

    walk(typer.main.get_command(build_app()), ())
    return found


def kind(leaf: Leaf, param: Any) -> str:
    """The type typer shows for a parameter: <int>, <float>, <str>, <path>, <list[Path]>, <bool>…"""
    return str(param.display_type_rich(typer._click.Context(leaf.command)))


def takes_value(leaf: Leaf, param: Any) -> bool:
    return param.param_type_name == "argument" or not getattr(param, "is_flag", False)


def example(leaf: Leaf) -> list[str]:
    """The first `gpufleet WORDS …` example of the command's help, as arguments after the command words."""
    prefix = f"gpufleet {leaf.name}"
    for line in re.findall(r"gpufleet [^`;\n]*", (leaf.command.help or "").replace("\n", " ")):
        if line == prefix or line.startswith(prefix + " "):
            return shlex.split(line)[len(leaf.words) + 1:]
    return []


def split_baseline(leaf: Leaf, args: list[str]) -> tuple[list[str], list[tuple[str, str | None]]]:
    """Baseline arguments as (positionals, [(option, value or None for a flag)])."""
    by_flag = {opt: param for param in leaf.options for opt in [*param.opts, *param.secondary_opts]}
    positionals: list[str] = []
    options: list[tuple[str, str | None]] = []
    tokens = iter(args)
    for token in tokens:
        param = by_flag.get(token.split("=", 1)[0])
        if param is None:
            positionals.append(token)
        elif "=" in token:
            options.append(tuple(token.split("=", 1)))  # type: ignore[arg-type]
        elif takes_value(leaf, param):
            options.append((token, next(tokens, "")))
        else:
            options.append((token, None))
    return positionals, options


def with_value(leaf: Leaf, base: tuple[list[str], list[tuple[str, str | None]]], param: Any,
               value: str | None) -> list[str]:
    """The baseline with one parameter set to `value` (an option replaced or added, an argument replaced)."""
    positionals, options = list(base[0]), list(base[1])
    if param.param_type_name == "argument":
        index = leaf.arguments.index(param)
        positionals += [""] * (index + 1 - len(positionals))
        positionals[index] = value or ""
    else:
        names = {*param.opts, *param.secondary_opts}
        options = [(flag, old) for flag, old in options if flag not in names]
        options.append((param.opts[0], value))
    flat = list(positionals)
    for flag, old in options:
        if old is None:
            flat.append(flag)
        elif flag.startswith("--"):
            flat.append(f"{flag}={old}")  # a value starting with '-' stays a value
        else:
            flat += [flag, old]
    return [*leaf.words, *flat]


def hostile_files(tmp: Path) -> dict[str, str]:
    """Bad files of every sort, by name; paths as text."""
    files: dict[str, str] = {}

    def write(name: str, text: str | bytes) -> None:
        path = tmp / name
        path.write_bytes(text.encode() if isinstance(text, str) else text)
        files[name] = str(path)

    write("deep.yaml", "a: " + "[" * 1000 + "]" * 1000 + "\n")
    write("deep.json", "[" * 100_000 + "]" * 100_000)
    write("binary.yaml", bytes(range(256)) * 4)
    write("empty.yaml", "")
    write("list.yaml", "[1, 2, 3]\n")
    write("date_id.yaml", "gpus:\n  - id: 2024-01-01\n    name: x\n")
    write("anchors.yaml", "a: &a [*a]\n")
    write("garbage.json", "{not json")
    sparse = tmp / "big.yaml"
    with sparse.open("wb") as handle:
        handle.truncate(MAX_INPUT_BYTES + 1)
    files["big.yaml"] = str(sparse)
    os.mkfifo(tmp / "pipe.yaml")
    files["pipe.yaml"] = str(tmp / "pipe.yaml")
    (tmp / "pipe_folder").mkdir()
    os.mkfifo(tmp / "pipe_folder" / "a.yaml")
    files["pipe_folder"] = str(tmp / "pipe_folder")
    (tmp / "folder.yaml").mkdir()
    files["folder.yaml"] = str(tmp / "folder.yaml")
    (tmp / "loop.yaml").symlink_to(tmp / "loop.yaml")
    files["loop.yaml"] = str(tmp / "loop.yaml")
    files["missing.yaml"] = str(tmp / "missing.yaml")
    files["/dev/null"] = "/dev/null"
    # issue 31's classes
    write("huge_int.yaml", f"- id: a\n  num_gpus: {HUGE_DIGITS}\n")
    write("nul.yaml", "- id: a\n  name: b\x00c\n")
    write("surrogate.yaml", 'gpus:\n  - id: "\\udc80"\n')
    write("dup_key.yaml", "gpus:\n  - id: x\n    hbm_gib: 40\n    hbm_gib: 4000\n")
    write("dup_key.json", '{"plans": [], "plans": [1]}')
    write("huge_int.json", f'{{"plans": [{HUGE_DIGITS}]}}')
    write("laughs.yaml", "\n".join(["a0: &a0 [x, x, x, x, x, x, x, x, x]",
                                    *(f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 9)}]" for n in range(1, 9))]))
    files["/proc/kmsg"] = "/proc/kmsg"  # waits for kernel messages, and takes them, if read
    files["long_name"] = str(tmp / ("n" * 300 + ".yaml"))  # over the 255 bytes a file name may have
    return files


def path_values(files: dict[str, str]) -> list[str]:
    return list(files.values())


def corpus(tmp: Path, files: dict[str, str]) -> list[list[str]]:
    """Every invocation of the fuzz run, in a fixed order from a fixed seed."""
    rng = random.Random(SEED)
    invocations: list[list[str]] = []
    for leaf in leaves():
        baseline = [arg.replace("{tmp}", str(tmp)) for arg in BASELINES.get(leaf.name, example(leaf))]
        base = split_baseline(leaf, baseline)
        invocations.append([*leaf.words, *baseline])
        choices: list[tuple[Any, list[str | None]]] = []
        for param in [*leaf.arguments, *leaf.options]:
            if not takes_value(leaf, param):
                invocations.append(with_value(leaf, base, param, None))
                continue
            shown = kind(leaf, param)
            values: list[str | None] = [*TYPED_VALUES.get(shown, []), *rng.sample(COMMON_VALUES, COMMON_PER_PARAMETER)]
            if "path" in shown.lower() or param.param_type_name == "argument":
                values += path_values(files)
            choices.append((param, values))
            invocations += [with_value(leaf, base, param, value) for value in values]
        for _ in range(RANDOM_INVOCATIONS // len(leaves()) if choices else 0):
            args = list(baseline)
            for param, values in rng.sample(choices, min(3, len(choices))):
                args = with_value(leaf, split_baseline(leaf, args), param, rng.choice(values))[len(leaf.words):]
            invocations.append([*leaf.words, *args])
    return invocations + mutated_documents(tmp, rng) + damaged_texts(tmp, rng)


#: Values one field of a run or catalog record is changed to: the one-character typos and slips of a user's file.
FIELD_VALUES: list[Any] = [0, -1, 3, 16385, 1e-300, 1e308, float("inf"), "x", None, [1], {"a": 1}]
#: Mutated run files (`validate --runs`) and catalog files (cheap commands with --catalog) in the corpus.
MUTATED_RUN_FILES = 60
MUTATED_CATALOG_FILES = 40
#: The commands a mutated catalog is handed to (each reads the GPU, node and prices the mutation may break).
CATALOG_COMMANDS = [["memory", "-m", "llama3-8b", "-g", "h100-sxm", "-n", "8", "--tp", "8"],
                    ["facility", "--gpus", "64", "--gpu", "h100-sxm"],
                    ["cost", "--gpu-hours", "1e5", "--gpu", "h100-sxm"],
                    ["fabric", "simulate", "--gpus", "16", "--size", "1MiB"]]


def _leaves_of(record: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Paths to every number and flag in a record (what a typo changes)."""
    found: list[tuple[str, ...]] = []
    for key, value in record.items():
        if isinstance(value, dict):
            found += _leaves_of(value, (*prefix, key))
        elif isinstance(value, int | float) or value is None:
            found.append((*prefix, key))
    return found


def _with_field(record: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(record)
    target = changed
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return changed


def mutated_documents(tmp: Path, rng: random.Random) -> list[list[str]]:
    """Run files and catalog files with one field changed (seeded), written under `tmp`, and the invocation each."""
    run = yaml.safe_load((tmp / "one_run.yaml").read_text(encoding="utf-8"))[0]
    gpu = next(g for g in yaml.safe_load((Path(registry.__file__).parent / "data/gpus.yaml").read_text(
        encoding="utf-8"))["gpus"] if g["id"] == "h100-sxm")
    invocations: list[list[str]] = []
    for index in range(MUTATED_RUN_FILES):
        path = rng.choice(_leaves_of(run))
        target = tmp / f"mutated_run_{index}.yaml"
        target.write_text(yaml.safe_dump([_with_field(run, path, rng.choice(FIELD_VALUES))]), encoding="utf-8")
        invocations.append(["validate", "--runs", str(target)])
    for index in range(MUTATED_CATALOG_FILES):
        path = rng.choice(_leaves_of(gpu))
        target = tmp / f"mutated_catalog_{index}.yaml"
        target.write_text(yaml.safe_dump({"gpus": [_with_field(gpu, path, rng.choice(FIELD_VALUES))]}),
                          encoding="utf-8")
        invocations.append([*rng.choice(CATALOG_COMMANDS), "--catalog", str(target)])
    return invocations


#: How a file's text is damaged (issue 31's classes), each a function of the text and a seeded choice.
DAMAGE_KINDS = ("huge integer", "nul byte", "duplicated key", "lone surrogate")
#: Damaged run files and catalog files in the corpus (each kind in turn), and Megatron argument files.
DAMAGED_TEXTS = 40
DAMAGED_MEGATRON = 8
#: Degrees a Megatron argument file is given (tp and pp drawn from these): issue 31 saw tp -8, pp 0.
DEGREES = ["-8", "0", "1", "2", "8", "-1", "3"]


def damage(text: str, kind: str, rng: random.Random) -> str:
    """`text` with one damage of `kind`, at a seeded place: a number made 5,000 digits long, a NUL byte, a
    `key: value` line given twice in its mapping, a string value made a lone surrogate escape."""
    lines = text.splitlines()
    if kind == "nul byte":
        at = rng.randrange(len(text))
        return text[:at] + "\x00" + text[at:]
    pattern = {"huge integer": r"^(\s*(?:- )?\w+: )-?\d+\s*$", "duplicated key": r"^\s+\w+: \S.*$",
               "lone surrogate": r"^(\s*(?:- )?\w+: )[A-Za-z][\w .-]*$"}[kind]
    candidates = [index for index, line in enumerate(lines) if re.match(pattern, line)]
    index = rng.choice(candidates)
    if kind == "duplicated key":
        lines.insert(index + 1, lines[index])
    else:
        value = HUGE_DIGITS if kind == "huge integer" else '"\\udc80"'
        lines[index] = re.sub(pattern, lambda match: match.group(1) + value, lines[index])
    return "\n".join(lines) + "\n"


def shipped_texts(tmp: Path) -> dict[str, str]:
    """The two texts damaged: a run file of one shipped run and a catalog file of one shipped GPU."""
    gpu = next(g for g in yaml.safe_load((Path(registry.__file__).parent / "data/gpus.yaml").read_text(
        encoding="utf-8"))["gpus"] if g["id"] == "h100-sxm")
    return {"run": (tmp / "one_run.yaml").read_text(encoding="utf-8"),
            "catalog": yaml.safe_dump({"gpus": [gpu]}, sort_keys=False)}


def damaged_invocation(tmp: Path, base: str, text: str, name: str) -> list[str]:
    target = tmp / f"{name}.yaml"
    target.write_text(text, encoding="utf-8", errors="surrogatepass")
    return ["validate", "--runs", str(target)] if base == "run" else ["catalog", "list", "--catalog", str(target)]


def damaged_texts(tmp: Path, rng: random.Random) -> list[list[str]]:
    """Run and catalog files damaged as text (DAMAGE_KINDS in turn, seeded places), and Megatron argument files
    with seeded degrees for `launch --check`."""
    texts = shipped_texts(tmp)
    invocations = []
    for index in range(DAMAGED_TEXTS):
        base = ("run", "catalog")[index % 2]
        kind = DAMAGE_KINDS[index // 2 % len(DAMAGE_KINDS)]
        invocations.append(damaged_invocation(tmp, base, damage(texts[base], kind, rng), f"damaged_{index}"))
    for index in range(DAMAGED_MEGATRON):
        target = tmp / f"megatron_args_{index}.txt"
        target.write_text(f"--tensor-model-parallel-size {rng.choice(DEGREES)} --pipeline-model-parallel-size "
                          f"{rng.choice(DEGREES)} --micro-batch-size 1 --global-batch-size 64\n", encoding="utf-8")
        invocations.append(["launch", "--check", str(target), "--gpus", rng.choice(["8", "16", HUGE_DIGITS])])
    return invocations


class _Hang(Exception):
    pass


@dataclass(frozen=True)
class Outcome:
    args: tuple[str, ...]
    code: int | None
    stdout: str
    stderr: str
    crash: str = ""  # the traceback of an exception that escaped the entry point


def run_in_process(args: list[str]) -> Outcome:
    """`gpufleet ARGS` through the console script's own function, output captured, under an alarm."""
    stdout, stderr = io.StringIO(), io.StringIO()
    code: int | None = 0
    crash = ""

    def alarm(signum: int, frame: Any) -> None:
        raise _Hang

    outer_left_s = signal.getitimer(signal.ITIMER_REAL)[0]  # pytest-timeout's own alarm, if it set one
    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, INVOCATION_LIMIT_S)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            run(list(args))
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 2)
    except _Hang:
        code, crash = None, f"still running after {INVOCATION_LIMIT_S} s"
    except BaseException:  # what escapes the entry point is what the fuzz looks for
        code, crash = None, traceback.format_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_left_s:  # give the test's own timeout back what it had left
            signal.setitimer(signal.ITIMER_REAL, max(outer_left_s - (time.monotonic() - started), 0.001))
    return Outcome(tuple(args), code, stdout.getvalue(), stderr.getvalue(), crash)


def problems(outcome: Outcome) -> list[str]:
    """What is wrong with one outcome (nothing for a clean exit 0, 1 or 2)."""
    found: list[str] = []
    if outcome.crash:
        found.append(outcome.crash.strip().splitlines()[-1] if "Traceback" in outcome.crash else outcome.crash)
    elif outcome.code not in (0, 1, 2):
        found.append(f"exit code {outcome.code}")
    if "Traceback" in outcome.stdout or "Traceback" in outcome.stderr:
        found.append("a traceback in the output")
    lines = outcome.stderr.splitlines()
    if outcome.code == 2 and not (lines and lines[-1].startswith("error: ")):
        found.append(f"exit 2 without an `error:` line: {outcome.stderr[-300:]!r}")
    if outcome.code == 2 and sum(line.startswith("error: ") for line in lines) != 1:
        found.append(f"exit 2 with {sum(line.startswith('error: ') for line in lines)} error lines")
    if any(len(line) > MAX_MESSAGE_CHARS + len("error: ") for line in lines):
        found.append(f"a stderr line of {max(len(line) for line in lines):,} characters (a long value echoed)")
    return found


def _shown(args: tuple[str, ...]) -> str:
    return " ".join(repr(arg) if len(arg) < 60 else f"<{len(arg):,} characters>" for arg in args)


def _report(outcomes: list[Outcome], where: str) -> tuple[Counter[int | None], list[str]]:
    codes: Counter[int | None] = Counter(outcome.code for outcome in outcomes)
    failures = [f"gpufleet {_shown(o.args)}: {'; '.join(problems(o))}" for o in outcomes if problems(o)]
    print(f"\nfuzz ({where}): {len(outcomes)} invocations, exit codes {dict(sorted(codes.items(), key=str))}, "
          f"{len(failures)} with a problem")
    return codes, failures


def warm_megatron_import() -> None:
    """Import megatron-core once, when it is installed (as the first `launch --check` of a Megatron file in a process
    would: ~4 s, several times that on a loaded machine), so that INVOCATION_LIMIT_S measures gpufleet, not that."""
    if importlib.util.find_spec("megatron") is not None:
        from gpufleet.emit import read_megatron

        read_megatron._silenced(read_megatron._config_classes)


def is_megatron_check(args: list[str]) -> bool:
    """A `launch --check` of a Megatron argument file: each real process pays megatron-core's import (the refusal
    of its degrees through a real process is tests/test_input_bounds.py's)."""
    return args[:2] == ["launch", "--check"] and "megatron_args" in " ".join(args)


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("fuzz")
    files = hostile_files(tmp)
    shipped = Path(__file__).parent.parent / "src/gpufleet/catalog/runs/published_runs.yaml"
    first = "- id: " + shipped.read_text(encoding="utf-8").split("\n- id: ")[1]
    (tmp / "one_run.yaml").write_text(first, encoding="utf-8")
    (tmp / "ckpt_root").mkdir()
    (tmp / "ckpt_store").mkdir()
    yield tmp, files


def test_every_subcommand_is_fuzzed_from_a_baseline() -> None:
    """A command added later needs a baseline: an entry in BASELINES or an example in its --help."""
    missing = [leaf.name for leaf in leaves() if leaf.name not in BASELINES and not example(leaf)]
    assert not missing, f"no baseline and no `gpufleet …` example in --help: {missing}"
    assert {leaf.name for leaf in leaves()} >= {"plan", "validate", "cost", "memory", "fabric simulate"}


@pytest.mark.timeout(900)
@pytest.mark.filterwarnings("error::RuntimeWarning")  # an inf or NaN reaching numpy is a hole in input checking
def test_fuzzed_invocations_end_cleanly_in_process(fuzz_root: tuple[Path, dict[str, str]],
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    record_property: Any) -> None:
    tmp, files = fuzz_root
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv("COLUMNS", "160")
    monkeypatch.chdir(tmp)  # --plot, --html and friends write here
    # Each distinct --catalog value builds a new catalog, which parses the shipped YAML again (~0.3 s, as every
    # real process does once): parse the shipped files once here; the users' files still go through read_yaml.
    shipped = Path(registry.__file__).parent / "data"
    real_read_yaml = registry.read_yaml
    parsed: dict[Path, Any] = {}

    def read_shipped_once(path: Path, what: str = "catalog file") -> Any:
        if path.parent != shipped:
            return real_read_yaml(path, what)
        if path not in parsed:
            parsed[path] = real_read_yaml(path, what)
        return copy.deepcopy(parsed[path])

    monkeypatch.setattr(registry, "read_yaml", read_shipped_once)
    warm_megatron_import()
    invocations = corpus(tmp, files)
    outcomes = [run_in_process(args) for args in invocations]
    codes, failures = _report(outcomes, "in-process")
    record_property("fuzzed_invocations_in_process", len(outcomes))
    record_property("fuzzed_exit_codes_in_process", dict(codes))
    assert len(outcomes) >= 1000  # the corpus is fixed: a smaller one means commands or options went unfuzzed
    assert codes[2] > codes[0]  # mostly bad input: most invocations must be refused
    assert not failures, "\n".join(failures[:40])


def subprocess_set(tmp: Path, files: dict[str, str]) -> list[tuple[list[str], dict[str, str]]]:
    """(arguments, environment) pairs: named pipes and devices for every file option and in $GPUFLEET_CATALOG, the
    long arguments, and a seeded sample of the corpus."""
    chosen: list[list[str]] = []
    for leaf in leaves():
        base = split_baseline(leaf, [a.replace("{tmp}", str(tmp)) for a in BASELINES.get(leaf.name, example(leaf))])
        for param in leaf.options:
            shown = kind(leaf, param).lower()
            if "path" in shown and (param.name != "catalog" or leaf.name in ("catalog list", "validate", "plan")):
                for name in ("pipe.yaml", "pipe_folder" if "list" in shown else "/dev/null"):
                    chosen.append(with_value(leaf, base, param, files[name]))
    chosen.append(["catalog", "show", LONG])
    chosen.append(["plan", "-m", LONG_SPACED, "-t", "1T", "-n", "8"])
    chosen += random.Random(SEED).sample([args for args in corpus(tmp, files) if not is_megatron_check(args)],
                                         SUBPROCESS_SAMPLE)
    from_environment = [(["catalog", "list"], {ENV_VAR: files[name]}) for name in ("pipe_folder", "deep.yaml")]
    return [(args, {}) for args in chosen] + from_environment


@pytest.mark.timeout(900)
def test_fuzzed_invocations_end_cleanly_as_real_processes(fuzz_root: tuple[Path, dict[str, str]],
                                                          record_property: Any) -> None:
    tmp, files = fuzz_root
    outcomes = []
    for args, env in subprocess_set(tmp, files):
        try:
            done = run_gpufleet(*args, env=env, timeout=INVOCATION_LIMIT_S + 10)
            outcomes.append(Outcome(tuple(args), done.returncode, done.stdout, done.stderr))
        except Exception as error:  # a timeout is a hang: reported with the rest
            outcomes.append(Outcome(tuple(args), None, "", "", f"{type(error).__name__}: {error}"))
    codes, failures = _report(outcomes, "subprocess")
    record_property("fuzzed_exit_codes_subprocess", dict(codes))
    record_property("fuzzed_invocations_subprocess", len(outcomes))
    assert not failures, "\n".join(failures[:40])


#: Damaged files the property-based test draws (seeded: the same every run).
PROPERTY_EXAMPLES = 60


@pytest.mark.timeout(900)
@settings(max_examples=PROPERTY_EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(["run", "catalog"]), kind=st.sampled_from(DAMAGE_KINDS),
       place=st.integers(min_value=0, max_value=2**32))
def test_any_damaged_input_file_is_refused_in_one_line(fuzz_root: tuple[Path, dict[str, str]], base: str,
                                                       kind: str, place: int) -> None:
    """Whatever file is damaged, in whichever place, by any of issue 31's classes: exit 2, one `error:` line that
    names the file, no traceback (the in-process entry point, as the corpus runs it)."""
    tmp, _ = fuzz_root
    text = damage(shipped_texts(tmp)[base], kind, random.Random(place))
    args = damaged_invocation(tmp, base, text, f"property_{base}_{kind.replace(' ', '_')}_{place}")
    outcome = run_in_process(args)
    assert not problems(outcome), problems(outcome)
    assert outcome.code == 2 and Path(args[-1]).name in outcome.stderr, (kind, outcome.stderr)
