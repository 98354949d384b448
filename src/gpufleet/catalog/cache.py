"""The validated catalog, kept on disk between runs (gpufleet.disk_cache) so that a command skips YAML parsing.

Parsing and validating the built-in YAML costs more CPU than the rest of `gpufleet catalog show`. The cache key
is the contents of every file the catalog is built from: the package's catalog data and record definitions
(`catalog/*.py`, `catalog/data/*.yaml`), each user file named by `--catalog` or `$GPUFLEET_CATALOG` (a folder's
YAML files as listed now), and the gpufleet, pydantic and Python versions. Editing any of them, adding a file to
a user folder, or upgrading gpufleet rebuilds the entry. Only a catalog that passed `Catalog.check()` is stored;
one that fails is returned unchecked, so its error surfaces where it always did.
"""

from __future__ import annotations

from pathlib import Path

import pydantic

from gpufleet import disk_cache
from gpufleet.catalog.registry import Catalog, CatalogState, _builtin_files, _expand
from gpufleet.errors import GpufleetError

ENTRY_NAME = "catalog"


def package_files() -> list[Path]:
    """The package's own inputs to the catalog: its data files and the modules that define and build records."""
    return [*sorted(Path(__file__).parent.glob("*.py")), *_builtin_files()]


def catalog_key(user_paths: tuple[Path, ...], package: list[Path] | None = None) -> str:
    """The key of the catalog built from these user paths (raises CatalogError for a path that does not exist,
    as building the catalog would)."""
    files = [*(package_files() if package is None else package), *_expand(user_paths)]
    return disk_cache.content_key(files, pydantic.VERSION, ENTRY_NAME)


def cached_catalog(user_paths: tuple[Path, ...], package: list[Path] | None = None) -> Catalog:
    """The catalog for these user paths: from the cache when its entry is current, else built, checked and
    stored. `package` replaces the package's files in the key (tests point it at a copy)."""
    try:
        key = catalog_key(user_paths, package)
    except (OSError, GpufleetError):  # a missing or unreadable file: let the catalog itself say what is wrong
        return Catalog(user_paths)
    entry = disk_cache.entry_path(ENTRY_NAME, *(str(path) for path in user_paths))
    state = disk_cache.load(entry, key)
    if isinstance(state, CatalogState):
        return Catalog.restored(user_paths, state)
    built = Catalog(user_paths)
    try:
        built.check()
    except GpufleetError:
        return Catalog(user_paths)
    state = built.snapshot()
    disk_cache.store(entry, key, state)
    return Catalog.restored(user_paths, state)
