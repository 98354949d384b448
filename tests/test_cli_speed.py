"""Start-up speed without changed answers: the on-disk catalog cache, the root help's command index, and commands
that import only their own module. (CPU seconds are measured by benchmarks/bench_cli.py, never asserted here.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from clirun import run_gpufleet_process as run_gpufleet
from gpufleet import disk_cache
from gpufleet.catalog import cache
from gpufleet.catalog.records import GPUSpec
from gpufleet.catalog.registry import CatalogState

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "cache-home"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    monkeypatch.delenv("GPUFLEET_NO_CACHE", raising=False)
    return home


def _user_file(tmp_path: Path, hbm_gib: float) -> Path:
    """A user catalog that overrides h100-sxm's HBM size."""
    from gpufleet.catalog.registry import Catalog, as_plain

    entry = as_plain(Catalog().gpu("h100-sxm"))
    entry["hbm_gib"] = hbm_gib
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({"gpus": [entry]}), encoding="utf-8")
    return path


def _poison(user_paths: tuple[Path, ...], package: list[Path] | None, hbm_gib: float) -> None:
    """Store, under the key these inputs have now, a catalog whose h100-sxm has `hbm_gib`: whatever a later load
    returns for that GPU then says whether it came from this entry (a hit) or was rebuilt (a miss)."""
    built = cache.cached_catalog(user_paths, package)
    state = built.snapshot()
    gpus = dict(state.records["gpus"])
    gpus["h100-sxm"] = gpus["h100-sxm"].model_copy(update={"hbm_gib": hbm_gib})
    poisoned = replace(state, records={**state.records, "gpus": gpus})
    entry = disk_cache.entry_path(cache.ENTRY_NAME, *(str(path) for path in user_paths))
    disk_cache.store(entry, cache.catalog_key(user_paths, package), poisoned)


def _hbm_gib(user_paths: tuple[Path, ...], package: list[Path] | None = None) -> float:
    gpu = cache.cached_catalog(user_paths, package).gpu("h100-sxm")
    assert isinstance(gpu, GPUSpec)
    return gpu.hbm_gib


def test_a_current_entry_is_used_and_an_edited_user_file_rebuilds_it(cache_home: Path, tmp_path: Path) -> None:
    user = (_user_file(tmp_path, 90.0),)
    assert _hbm_gib(user) == 90.0
    _poison(user, None, 7.0)
    assert _hbm_gib(user) == 7.0  # the entry is read: the cache is really in use
    _user_file(tmp_path, 91.0)  # the user edits their file
    assert _hbm_gib(user) == 91.0
    assert _hbm_gib(user) == 91.0  # and the rebuilt entry is current


def test_a_file_added_to_a_user_folder_rebuilds_the_entry(cache_home: Path, tmp_path: Path) -> None:
    folder = tmp_path / "catalogs"
    folder.mkdir()
    (folder / "a.yaml").write_text("{}\n", encoding="utf-8")
    _poison((folder,), None, 7.0)
    assert _hbm_gib((folder,)) == 7.0
    shutil.move(_user_file(tmp_path, 92.0), folder / "b.yaml")
    assert _hbm_gib((folder,)) == 92.0


def test_a_change_to_the_package_catalog_rebuilds_the_entry(cache_home: Path, tmp_path: Path) -> None:
    copy = tmp_path / "package"
    copy.mkdir()
    package = []
    for path in cache.package_files():
        package.append(copy / path.name)
        shutil.copy(path, package[-1])
    _poison((), package, 7.0)
    assert _hbm_gib((), package) == 7.0
    gpus = copy / "gpus.yaml"
    gpus.write_text(gpus.read_text(encoding="utf-8") + "# edited\n", encoding="utf-8")
    assert _hbm_gib((), package) == 80.0  # rebuilt from the (real) package data: H100 SXM has 80 GiB
    records = copy / "records.py"  # so does a change to the record definitions
    _poison((), package, 7.0)
    records.write_text(records.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    assert _hbm_gib((), package) == 80.0


@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped", "empty", "other-type"])
def test_a_corrupt_entry_is_ignored_and_rewritten(cache_home: Path, damage: str) -> None:
    assert _hbm_gib(()) == 80.0
    entry = disk_cache.entry_path(cache.ENTRY_NAME)
    data = entry.read_bytes()
    header, payload = data.split(b"\n", 1)
    if damage == "garbage":
        entry.write_bytes(b"\x80\x04not a pickle at all")
    elif damage == "truncated":
        entry.write_bytes(data[: len(data) // 2])
    elif damage == "flipped":  # one byte of the payload changed, the header intact
        entry.write_bytes(header + b"\n" + payload[:100] + bytes([payload[100] ^ 0xFF]) + payload[101:])
    elif damage == "empty":
        entry.write_bytes(b"")
    else:  # a well-formed entry holding something that is not a catalog
        disk_cache.store(entry, cache.catalog_key(()), {"not": "a catalog"})
    assert _hbm_gib(()) == 80.0
    assert isinstance(disk_cache.load(entry, cache.catalog_key(())), CatalogState)  # rewritten whole


def test_an_unwritable_cache_folder_only_costs_speed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file-not-folder"
    blocker.write_text("", encoding="utf-8")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert _hbm_gib(()) == 80.0


def test_an_invalid_user_file_is_not_cached_and_fails_as_before(cache_home: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus:\n  - {id: x, source: somewhere}\n", encoding="utf-8")
    for _ in range(2):
        done = run_gpufleet("catalog", "show", "h100-sxm", "--catalog", str(bad),
                            env={"XDG_CACHE_HOME": str(cache_home)})
        assert done.returncode == 2 and "bad.yaml" in done.stderr
    assert not list((cache_home / "gpufleet").glob("catalog-*"))


def _modules_after(args: list[str], cache_home: Path) -> set[str]:
    """The gpufleet modules a command line imports (run in a fresh interpreter)."""
    script = ("import json, sys\nfrom gpufleet.cli.main import run\n"
              f"try:\n    run({args!r})\nexcept SystemExit:\n    pass\n"
              "names = sorted(m for m in sys.modules if m.startswith(('gpufleet', 'numpy', 'scipy')))\n"
              "sys.stderr.write(json.dumps(names))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=120,
                          env=_env(cache_home))
    return set(json.loads(done.stderr.splitlines()[-1]))


def _env(cache_home: Path) -> dict[str, str]:
    import os

    environment = {key: value for key, value in os.environ.items() if key not in ("GPUFLEET_CATALOG",
                                                                                    "GPUFLEET_NO_CACHE")}
    return {**environment, "XDG_CACHE_HOME": str(cache_home), "COLUMNS": "160"}


def test_root_help_from_the_index_is_the_same_text_and_imports_no_command(cache_home: Path) -> None:
    cold = run_gpufleet("--help", env={"XDG_CACHE_HOME": str(cache_home)})
    warm = run_gpufleet("--help", env={"XDG_CACHE_HOME": str(cache_home)})
    assert cold.returncode == warm.returncode == 0
    assert warm.stdout == cold.stdout
    assert "plan" in warm.stdout and "catalog" in warm.stdout
    bare = run_gpufleet(env={"XDG_CACHE_HOME": str(cache_home)})  # no command: help, then one error line
    assert bare.returncode == 2 and warm.stdout.strip() in bare.stdout
    imported = _modules_after(["--help"], cache_home)
    assert not {"gpufleet.cli.plan", "gpufleet.planner.plan", "numpy"} & imported


def test_a_command_imports_only_its_own_module(cache_home: Path) -> None:
    imported = _modules_after(["catalog", "show", "llama3-8b"], cache_home)
    assert "gpufleet.cli.catalog" in imported
    assert not {"gpufleet.cli.plan", "gpufleet.cli.fabric", "gpufleet.planner.search", "scipy"} & imported


def test_plan_starts_without_numpy(cache_home: Path) -> None:
    """numpy's import costs ~0.3 s of CPU, more than a small plan's search: only scatter placement needs it."""
    imported = _modules_after(["plan", "-m", "llama3-8b", "-n", "8", "--global-batch", "8", "--json"], cache_home)
    assert "gpufleet.planner.search" in imported
    assert not {"numpy", "scipy"} & imported


def test_a_misspelt_command_still_gets_the_full_list(cache_home: Path) -> None:
    done = run_gpufleet("pln", env={"XDG_CACHE_HOME": str(cache_home)})
    assert done.returncode == 2 and "pln" in done.stderr


def test_regression_guard_plan_json_is_the_same_with_and_without_the_cache(cache_home: Path) -> None:
    """Regression guard: the cache changes where the catalog comes from, never the answer."""
    args = ("plan", "-m", "llama3-8b", "-t", "1T", "-g", "h100-sxm", "-n", "32", "--global-batch", "256", "--json")
    off = run_gpufleet(*args, env={"GPUFLEET_NO_CACHE": "1", "XDG_CACHE_HOME": str(cache_home)})
    cold = run_gpufleet(*args, env={"XDG_CACHE_HOME": str(cache_home)})
    warm = run_gpufleet(*args, env={"XDG_CACHE_HOME": str(cache_home)})
    assert off.returncode == cold.returncode == warm.returncode == 0, off.stderr
    assert list((cache_home / "gpufleet").glob("catalog-*"))  # the warm run had an entry to read
    assert json.loads(off.stdout) == json.loads(cold.stdout) == json.loads(warm.stdout)


def test_no_home_folder_means_no_cache_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert not disk_cache.cache_enabled()
    assert _hbm_gib(()) == 80.0


@pytest.mark.parametrize("special", ["fifo", "device"])
def test_a_user_catalog_that_is_not_a_regular_file_is_never_read_for_the_key(cache_home: Path, tmp_path: Path,
                                                                            special: str) -> None:
    """A named pipe would block a reader forever and /dev/zero never ends: the key is not computed from them, and
    the command fails with the catalog reader's own one-line refusal."""
    import os

    if special == "fifo":
        path = tmp_path / "pipe.yaml"
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    done = run_gpufleet("catalog", "show", "h100-sxm", "--catalog", str(path),
                        env={"XDG_CACHE_HOME": str(cache_home)}, timeout=60)
    assert done.returncode == 2 and str(path) in done.stderr and len(done.stderr.splitlines()) == 1


def test_the_built_in_catalog_can_be_stored_at_all(cache_home: Path) -> None:
    """Every record type must survive pickling, or the cache silently stores nothing (a parametrised pydantic
    generic such as Sourced[bool] has no importable name: that is why catalog/stacks.py names its subclasses)."""
    import pickle

    from gpufleet.catalog.registry import Catalog

    built = Catalog(())
    built.check()
    state = built.snapshot()
    assert pickle.loads(pickle.dumps(state)).records.keys() == state.records.keys()
