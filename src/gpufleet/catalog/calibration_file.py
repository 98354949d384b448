"""A calibration profile file: a catalog file holding only `calibrations:` entries (what `gpufleet calibrate`
writes and `--calibration FILE` reads). Its entries override the built-in profiles of the same GPU ids."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from gpufleet.catalog.calibration import CalibrationProfile
from gpufleet.catalog.registry import Catalog, describe_validation_error, read_yaml
from gpufleet.errors import CatalogError

KIND = "calibrations"


def read_calibration_file(path: Path) -> list[CalibrationProfile]:
    """The profiles in `path`; CatalogError (one line) when it is not a calibration profile file."""
    document = read_yaml(path, "calibration profile")
    if not isinstance(document, dict) or set(document) != {KIND} or not isinstance(document[KIND], list):
        raise CatalogError(f"calibration profile {path} must hold only a '{KIND}:' list (as `gpufleet calibrate` "
                           "writes it)")
    profiles = []
    for entry in document[KIND]:
        try:
            profiles.append(CalibrationProfile.model_validate(entry))
        except ValidationError as error:
            label = entry.get("id", "?") if isinstance(entry, dict) else "?"
            raise CatalogError(f"calibration profile {path}: entry {label!r}: "
                               f"{describe_validation_error(error)}") from error
    if not profiles:
        raise CatalogError(f"calibration profile {path} holds no entries")
    return profiles


def calibration_yaml(profiles: list[CalibrationProfile], header: str) -> str:
    """The YAML text of a profile file, `header` as leading comment lines."""
    entries = [{name: value for name, value in profile.model_dump(mode="json", exclude_none=True).items()
                if value != []} for profile in profiles]  # an unmeasured (empty) list is left out, as a None is
    body = yaml.safe_dump({KIND: entries},
                          sort_keys=False, allow_unicode=True, width=100)
    comments = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comments + body


def measured_write_bytes_per_s(catalog: Catalog, gpu_id: str) -> float | None:
    """The checkpoint write bandwidth per node that `gpu_id`'s calibration profile measured (bench disk), if any."""
    profile = catalog.records("calibrations").get(gpu_id)
    if isinstance(profile, CalibrationProfile) and profile.checkpoint_write_gbytes_per_s is not None:
        return profile.checkpoint_write_gbytes_per_s * 1e9
    return None
