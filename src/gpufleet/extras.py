"""The one owner of gpufleet's optional extras: which module comes with which extra, and the one line a user reads
when a command needs an extra that is not installed (`MissingExtraError`: exit 2, never a traceback).

Commands import the extra's modules lazily; `require_extra` is the explicit check where a reader wants to say what
it needed the module for, and `missing_extra` turns any other failed import of an extra's module (deep in the
runtime) into the same error, in the CLI's one place that prints errors.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from types import ModuleType

from gpufleet.errors import GpufleetError

#: Top-level module -> (the extra that installs it, the distribution that provides it), from pyproject.toml's
#: [project.optional-dependencies].
EXTRA_MODULES: dict[str, tuple[str, str]] = {
    "torch": ("runtime", "torch"),
    "prometheus_client": ("runtime", "prometheus-client"),
    "fsspec": ("runtime", "fsspec"),
    "s3fs": ("runtime", "s3fs"),
    "xxhash": ("runtime", "xxhash"),
    "pynvml": ("runtime", "nvidia-ml-py"),
    "tenacity": ("runtime", "tenacity"),
    "matplotlib": ("plot", "matplotlib"),
    "deepspeed": ("deepspeed", "deepspeed"),
    "megatron": ("megatron", "megatron-core"),
    "torchtitan": ("torchtitan", "torchtitan"),
    # torchtitan 0.3.0's config registries import it (torchtitan.components.validate -> torchtitan.hf_datasets)
    "datasets": ("torchtitan", "datasets"),
}
#: The newest fsspec that datasets 4.7.0 (torchtitan 0.3.0's, which takes datasets >=3.6,<4.8, each pinning fsspec
#: at most to its own day's release) accepts; the runtime extra pins fsspec==2026.9.0, so pip cannot install the
#: torchtitan extra beside it and the hint there is two commands: torchtitan's imports, then torchtitan and datasets
#: without their pins (as scripts/test does).
DATASETS_FSSPEC_CAP = (2026, 2, 0)
TORCHTITAN_BESIDE_RUNTIME = "pip install --no-deps torchtitan==0.3.0 datasets==4.7.0"


def _top(module: str) -> str:
    return module.split(".", 1)[0]


def _version(distribution: str) -> tuple[int, ...] | None:
    """An installed distribution's release numbers (2026.9.0 -> (2026, 9, 0)); None when it is not installed."""
    try:
        text = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    release = re.match(r"\d+(?:\.\d+)*", text)
    return tuple(int(part) for part in release.group().split(".")) if release else None


def install_command(extra: str) -> str:
    """The pip command that installs `extra` here. The torchtitan extra beside an fsspec newer than datasets allows
    (the runtime extra's) cannot be resolved by pip: then the two commands that install it all the same."""
    fsspec = _version("fsspec")
    if extra not in ("torchtitan", "launch-check") or fsspec is None or fsspec <= DATASETS_FSSPEC_CAP:
        return f"pip install 'gpufleet[{extra}]'"
    imports = "deepspeed,megatron,torchtitan-imports" if extra == "launch-check" else "torchtitan-imports"
    return (f"pip install 'gpufleet[{imports}]' && {TORCHTITAN_BESIDE_RUNTIME} (not pip install 'gpufleet[{extra}]': "
            f"datasets 4.7.0, which torchtitan's config registries import, pins fsspec<="
            f"{'.'.join(map(str, DATASETS_FSSPEC_CAP))} against the fsspec {'.'.join(map(str, fsspec))} installed "
            "here, the runtime extra's)")


def extra_of(module: str) -> str:
    """The extra that installs `module` (a top-level name of EXTRA_MODULES, or a module under one)."""
    return EXTRA_MODULES[_top(module)][0]


class MissingExtraError(GpufleetError, ImportError):
    """A module of an optional extra is not installed: names the extra and the pip command that installs it."""

    def __init__(self, extra: str, distribution: str, purpose: str | None = None, alternative: str | None = None
                 ) -> None:
        self.extra = extra
        self.distribution = distribution
        self.purpose = purpose
        self.alternative = alternative
        super().__init__(str(self))

    @property
    def install(self) -> str:
        return install_command(self.extra)

    def __str__(self) -> str:
        needs = f"{self.purpose} needs" if self.purpose else "this needs"
        alternative = f" ({self.alternative})" if self.alternative else ""
        return (f"{needs} {self.distribution}, from the {self.extra} extra, which is not installed: {self.install}"
                f"{alternative}")


def missing_extra(error: ImportError, purpose: str | None = None, alternative: str | None = None
                  ) -> MissingExtraError | None:
    """The MissingExtraError a failed import stands for (its missing module belongs to an extra), else None (a
    module no extra provides: a bug or a broken install, to be shown as it is)."""
    if isinstance(error, MissingExtraError):
        return error
    cause = error.__cause__  # fsspec re-raises a back end's missing module as ImportError('Install s3fs …')
    name = getattr(error, "name", None) or getattr(cause, "name", None)
    known = EXTRA_MODULES.get(_top(name)) if isinstance(name, str) else None
    if known is None:
        return None
    return MissingExtraError(*known, purpose=purpose, alternative=alternative)


def require_extra(module: str, purpose: str, alternative: str | None = None) -> ModuleType:
    """`module` imported, or MissingExtraError naming its extra when it (or a module it needs) is not installed.
    `purpose` says what needs it ('checking a DeepSpeed config'); `alternative`, what works without it."""
    extra, distribution = EXTRA_MODULES[_top(module)]
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise (missing_extra(error, purpose, alternative)
               or MissingExtraError(extra, distribution, purpose, alternative)) from error
