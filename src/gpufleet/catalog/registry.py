"""The catalog: built-in YAML shipped in the package plus user files, validated into typed records.

User files (`--catalog FILE|DIR`, or the `GPUFLEET_CATALOG` environment variable, paths separated by
the OS path separator) have the same shape as the built-in ones: a mapping from kind (`gpus`, `nodes`,
`networks`, `models`, …) to a list of records. A user record with an existing id replaces it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.economics_records import ECONOMICS_KINDS
from gpufleet.catalog.fits import FitRecord, apply_fits
from gpufleet.catalog.intervals import IntervalRecord
from gpufleet.catalog.judgements import ConstantFit, JudgementRecord, Judgements, catalog_judgements
from gpufleet.catalog.records import GPUSpec, ModelSpec, NetworkSpec, NodeSpec, Record
from gpufleet.catalog.stacks import StackChoice, StackRecord, resolve_stack
from gpufleet.errors import CatalogError, UnknownNameError, describe_validation_error
from gpufleet.input_files import load_yaml

ENV_VAR = "GPUFLEET_CATALOG"
#: The GPU a command or request assumes when neither a GPU nor a node names one.
DEFAULT_GPU = "h100-sxm"

#: kind name -> record type (economics kinds come from catalog.economics_records).
KINDS: dict[str, type[Record]] = {
    "gpus": GPUSpec,
    "nodes": NodeSpec,
    "networks": NetworkSpec,
    "models": ModelSpec,
    "calibrations": CalibrationProfile,
    "stacks": StackRecord,
    "fits": FitRecord,
    "intervals": IntervalRecord,
    "judgements": JudgementRecord,
    "constant_fits": ConstantFit,
    **ECONOMICS_KINDS,
}

R = TypeVar("R", bound=Record)

#: Fields that name a record of another kind: (kind, field, kind it names). A calibration's id is a GPU id.
REFERENCES: tuple[tuple[str, str, str], ...] = (
    ("nodes", "gpu", "gpus"),
    ("nodes", "default_network", "networks"),
    ("calibrations", "id", "gpus"),
    ("cloud_offers", "gpu", "gpus"),
    ("purchase_prices", "node", "nodes"),
    ("purchase_prices", "network", "networks"),
    ("failure_stats", "gpu", "gpus"),
    ("reliability_defaults", "failure_stats", "failure_stats"),
)
_SINGULAR = {"gpus": "GPU", "networks": "network", "nodes": "node", "failure_stats": "failure_stats record"}


def read_yaml(path: Path, what: str = "catalog file") -> Any:
    """Parse one YAML file; a missing file, one that is not a regular file of bounded size (a named pipe, a device,
    a folder), a syntax error or nesting too deep becomes a one-line CatalogError (gpufleet.input_files)."""
    return load_yaml(path, what, CatalogError)


def _builtin_files() -> list[Path]:
    data = resources.files("gpufleet.catalog") / "data"
    return sorted(Path(str(entry)) for entry in data.iterdir() if entry.name.endswith(".yaml"))


def _expand(paths: Iterable[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            try:
                files.extend(sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml")))
            except OSError as error:
                raise CatalogError(f"cannot list catalog folder {path}: {error.strerror}") from None
        elif os.path.lexists(path):
            files.append(path)  # read_yaml refuses what is not a regular file (/dev/null, a named pipe, a link loop)
        else:
            raise CatalogError(f"catalog path {path} does not exist (give a YAML file or a folder of them)")
    return files


def user_catalog_paths(explicit: Sequence[str | Path] = ()) -> tuple[Path, ...]:
    """Paths from the environment variable first, then explicit `--catalog` paths (later wins)."""
    env = [p for p in os.environ.get(ENV_VAR, "").split(os.pathsep) if p]
    return tuple(Path(p) for p in [*env, *explicit])


@dataclass(frozen=True)
class CatalogState:
    """A validated catalog's contents (what catalog.cache keeps on disk)."""

    raw: dict[str, list[tuple[Path, dict[str, Any]]]]
    records: dict[str, dict[str, Record]]
    origins: dict[tuple[str, str], Path]
    empty_user_paths: list[Path]


@dataclass
class Catalog:
    """Records by kind and id. Built lazily per kind; user files override built-in ids."""

    user_paths: tuple[Path, ...] = ()
    _raw: dict[str, list[tuple[Path, dict[str, Any]]]] | None = field(default=None, repr=False)
    _records: dict[str, dict[str, Record]] = field(default_factory=dict, repr=False)
    _origins: dict[tuple[str, str], Path] = field(default_factory=dict, repr=False)
    _empty_user_paths: list[Path] = field(default_factory=list, repr=False)
    _checked: bool = field(default=False, repr=False)
    _judgements: Judgements | None = field(default=None, repr=False)

    def _raw_entries(self) -> dict[str, list[tuple[Path, dict[str, Any]]]]:
        if self._raw is None:
            raw: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
            user_files = _expand(self.user_paths)
            self._empty_user_paths = [path for path in self.user_paths if path.is_dir()
                                      and not any(f.parent == path for f in user_files)]
            for path in [*_builtin_files(), *user_files]:
                document = read_yaml(path)
                if document is None or document == {}:
                    if path in user_files:
                        self._empty_user_paths.append(path)
                    continue
                if not isinstance(document, dict):
                    raise CatalogError(f"catalog file {path} must be a mapping of kind -> list of records")
                for kind, entries in document.items():
                    if not isinstance(entries, list):
                        raise CatalogError(f"catalog file {path}: '{kind}' must be a list of records")
                    ids_here: set[str | None] = set()
                    for entry in entries:
                        if not isinstance(entry, dict):
                            raise CatalogError(f"catalog file {path}: every item of '{kind}' must be a mapping")
                        record_id = entry.get("id")
                        if isinstance(record_id, str) and record_id in ids_here:
                            raise CatalogError(f"catalog file {path}: {kind} id {record_id!r} appears twice "
                                               "(one entry per id and file)")
                        ids_here.add(record_id if isinstance(record_id, str) else None)  # validation names the rest
                        raw.setdefault(str(kind), []).append((path, entry))
            self._raw = raw
        return self._raw

    def records(self, kind: str) -> dict[str, Record]:
        """All records of a kind, by id (validated on first use)."""
        if kind not in self._records:
            record_type = KINDS.get(kind)
            if record_type is None:
                raise UnknownNameError("catalog kind", kind, KINDS)
            built: dict[str, Record] = {}
            for path, entry in self._raw_entries().get(kind, []):
                try:
                    record = record_type.model_validate(entry)
                except ValidationError as error:
                    label = entry.get("id", "?")
                    raise CatalogError(
                        f"catalog file {path}: {kind} entry {label!r}: {describe_validation_error(error)}"
                    ) from error
                built[record.id] = record
                self._origins[(kind, record.id)] = path
            self._records[kind] = built
        unknown = set(self._raw_entries()) - set(KINDS)
        if unknown:
            raise CatalogError(f"unknown catalog kind(s) {sorted(unknown)}; known: {sorted(KINDS)}")
        return self._records[kind]

    def check(self) -> list[str]:
        """Validate every kind and every reference between records now, so that a broken user file fails
        whichever command reads it; returns notes on user files and folders that add nothing (once: a later call
        on the same, cached catalog returns none)."""
        if self._checked:
            return []
        for kind in KINDS:
            self.records(kind)
        for kind, field_name, target in REFERENCES:
            known = self.records(target)
            for record_id, record in self.records(kind).items():
                value = getattr(record, field_name, None)
                if value is not None and value not in known:
                    path = self._origins[(kind, record_id)]
                    what = "its id" if field_name == "id" else f"{field_name} {value!r}"
                    raise CatalogError(f"catalog file {path}: {kind} entry {record_id!r}: {what} names no "
                                       f"{_SINGULAR[target]} in the catalog; "
                                       f"known: {', '.join(sorted(known))}")
        self.judgements()  # the typed view: an unknown id or a value out of range fails here too
        self._checked = True
        return [f"catalog {'folder' if path.is_dir() else 'file'} {path} adds nothing"
                + (" (no .yaml or .yml files in it)" if path.is_dir() else " (empty)")
                for path in self._empty_user_paths]

    def snapshot(self) -> CatalogState:
        """Everything check() validated, for the on-disk cache (catalog.cache); call after check()."""
        return CatalogState(self._raw_entries(), dict(self._records), dict(self._origins),
                            list(self._empty_user_paths))

    @classmethod
    def restored(cls, user_paths: tuple[Path, ...], state: CatalogState) -> Catalog:
        """A catalog from a snapshot of one with the same user files (check() still runs its cheap part: the
        references, and the notes on user files that add nothing)."""
        return cls(user_paths, state.raw, dict(state.records), dict(state.origins), list(state.empty_user_paths))

    def get(self, kind: str, name: str, record_type: type[R]) -> R:
        """One record by id, or UnknownNameError with the nearest ids."""
        found = self.records(kind)
        if name not in found:
            raise UnknownNameError(kind.rstrip("s"), name, found)
        record = found[name]
        if not isinstance(record, record_type):
            raise CatalogError(f"{kind} entry {name!r} is not a {record_type.__name__}")
        return record

    def gpu(self, name: str) -> GPUSpec:
        return self.get("gpus", name, GPUSpec)

    def node(self, name: str) -> NodeSpec:
        return self.get("nodes", name, NodeSpec)

    def network(self, name: str) -> NetworkSpec:
        return self.get("networks", name, NetworkSpec)

    def model(self, name: str) -> ModelSpec:
        return self.get("models", name, ModelSpec)

    def calibration(self, gpu_id: str, fitted: Mapping[str, float] | None = None) -> CalibrationProfile:
        """The GPU's calibration profile (a user profile with the same id overrides the built-in one), with the
        recorded fits (`fits:`) applied where the profile does not set the field itself; `fitted` replaces
        recorded values by fit id (cross-validation)."""
        return apply_fits(self.get("calibrations", gpu_id, CalibrationProfile), self.fits(), fitted)

    def fits(self) -> list[FitRecord]:
        """The recorded calibration fits (`fits:`)."""
        return [record for record in self.records("fits").values() if isinstance(record, FitRecord)]

    def interval_table(self, table_id: str = "leave-one-source-out") -> IntervalRecord:
        """The recorded prediction-interval table (`intervals:`; planner/intervals.py turns it into intervals)."""
        return self.get("intervals", table_id, IntervalRecord)
    def judgements(self) -> Judgements:
        """The model's judgement constants and constant fits (`judgements:`, `constant_fits:`; a user record
        overrides one by id), checked for range (catalog.judgements)."""
        if self._judgements is None:
            self._judgements = catalog_judgements(self)
        return self._judgements

    def origin(self, kind: str, record_id: str) -> Path:
        """The file a record came from."""
        self.records(kind)
        return self._origins[(kind, record_id)]

    def stack(self, name: str) -> StackRecord:
        """A framework stack's documented settings (`stacks:`; `plan --stack`, a run file's `stack:`): `name` as
        an id, FAMILY@VERSION or a bare family name (`stack_choice`)."""
        return self.stack_choice(name).record

    def stack_choice(self, name: str) -> StackChoice:
        """`name` resolved to a stack record (catalog.stacks.resolve_stack), or UnknownNameError listing the ids and
        the families a bare name may give."""
        stacks = {key: record for key, record in self.records("stacks").items() if isinstance(record, StackRecord)}
        choice = resolve_stack(name, stacks)
        if choice is None:
            families = {record.family for record in stacks.values() if record.family and record.conservative}
            raise UnknownNameError("stack", name, {*stacks, *families})
        return choice

    def node_for_gpu(self, gpu_id: str) -> NodeSpec:
        """The catalog's default node for a GPU (the first node record that holds it)."""
        self.gpu(gpu_id)
        for node in self.records("nodes").values():
            if isinstance(node, NodeSpec) and node.gpu == gpu_id:
                return node
        raise CatalogError(f"no node in the catalog holds GPU {gpu_id!r}; add one under 'nodes:'")

    def find(self, name: str) -> tuple[str, Record]:
        """Look a name up across every kind (for `catalog show`)."""
        for kind in KINDS:
            if name in self.records(kind):
                return kind, self.records(kind)[name]
        if "@" in name:  # a framework release (nemo@24.12): the stack record of the range that holds it
            return "stacks", self.stack(name)
        every = sorted({n for kind in KINDS for n in self.records(kind)})
        raise UnknownNameError("catalog entry", name, every)


@cache
def _cached(user_paths: tuple[Path, ...]) -> Catalog:
    from gpufleet.catalog.cache import cached_catalog  # the on-disk cache of the validated catalog

    return cached_catalog(user_paths)


def load_catalog(explicit: Sequence[str | Path] = ()) -> Catalog:
    """The catalog with the environment's and the caller's user files (cached per set of paths)."""
    return _cached(user_catalog_paths(explicit))


def as_plain(record: BaseModel) -> dict[str, Any]:
    """A record as JSON-ready data."""
    return record.model_dump(mode="json", exclude_none=True)
