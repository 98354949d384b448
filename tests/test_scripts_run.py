"""`scripts/run` (the README's first command) installs only when it must: when .venv has no gpufleet, or
pyproject.toml changed since the last install (its hash in a stamp); otherwise it starts the plan at once."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def _checkout(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "run", tmp_path / "scripts" / "run")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'not-installable'\n")
    fake = tmp_path / ".venv" / "bin" / "gpufleet"  # stands in for an installed gpufleet: echoes its arguments
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho planned \"$@\"\n")
    fake.chmod(0o755)
    return tmp_path


def _run(checkout: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(checkout / "scripts" / "run"), "--top", "1"], capture_output=True, text=True,
                          timeout=120, check=False)


def test_an_installed_venv_with_a_current_stamp_plans_without_installing(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path)
    digest = hashlib.sha256((checkout / "pyproject.toml").read_bytes()).hexdigest()[:16]
    (checkout / ".venv" / f".gpufleet-run-{digest}").touch()
    done = _run(checkout)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "planned plan --model llama3-8b --tokens 1T --gpu h100-sxm --gpus 64 --top 1"


@pytest.mark.slow  # it creates a venv
def test_a_changed_pyproject_installs_again(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path)
    (checkout / ".venv" / ".gpufleet-run-0000000000000000").touch()  # the stamp of another pyproject.toml
    done = _run(checkout)
    # it tried to install: this pyproject.toml names no package that pip can build, so the install fails
    assert done.returncode != 0 and "planned" not in done.stdout
