"""The step model's optional terms as `plan` and `validate` turn them on: waiting for the slowest GPU
(perf/dp_scaling.py, docs/dp-scaling.md), compute slowed under hidden collectives (perf/overlap_contention.py,
docs/residuals.md), FSDP2's copies on the compute stream (perf/fsdp_overheads.py), FP8 amax synchronisation and the
interleaved data-parallel overlap window (perf/dp_scaling.py, docs/dp-scaling.md), and an interleaved pipeline's
sends under compute (perf/pipeline.py). On by default: the overlap contention at its measured slowdown, the FP8 amax
wait at its recorded fit, the chunks window and the pipeline sends' overlap; FSDP2's copies as the stack decides
(catalog/data/stacks.yaml) unless the user overrides it; the stragglers off."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Literal, cast, get_args

from gpufleet.catalog.stacks import Fp8Recipe
from gpufleet.errors import InputError
from gpufleet.perf.overlap_contention import OVERLAP_COMPUTE_SLOWDOWN
from gpufleet.perf.step import StepOptions
from gpufleet.units import parse_fraction

StragglerScope = Literal["job", "replicas"]
STRAGGLER_SCOPES: tuple[StragglerScope, ...] = ("job", "replicas")
DpOverlapWindow = Literal["micro-batch", "chunks"]
DP_OVERLAP_WINDOWS: tuple[DpOverlapWindow, ...] = ("micro-batch", "chunks")
#: `--fp8-amax-sync recorded`: the recorded constant fit (catalog/data/fits.yaml fp8-amax-sync-sigma).
RECORDED: Literal["recorded"] = "recorded"
#: The largest per-GPU speed spread accepted (judgement: 13x the sourced 1.5 %, dp_scaling.GPU_SPEED_SIGMA; at 20 %
#: a normal speed model already puts GPUs at zero speed 5 sigma below the median, so a larger value is a typo such
#: as 2 for 2 %).
MAX_STRAGGLER_SIGMA = 0.2
#: `--overlap-contention measured` (also when not given): the measured slowdown; `off` (or 0): none.
MEASURED = "measured"
OFF = "off"
#: `--fp8-recipe`: the recipes a plan may name (catalog/stacks.py Fp8Recipe).
FP8_RECIPES: tuple[Fp8Recipe, ...] = get_args(Fp8Recipe)


@dataclass(frozen=True)
class ModelTerms:
    """The optional step terms a user asked for; `apply` puts them on a stack's StepOptions. Each None is a term
    the user left alone: it keeps what the options already say (StepOptions' default, or the stack's), so the
    defaults have one owner, StepOptions."""

    straggler_sigma: float | None = None  # perf/dp_scaling.py straggler_s
    straggler_scope: StragglerScope | None = None
    overlap_slowdown: float | None = None  # perf/overlap_contention.py
    fsdp2_copies: bool | None = None  # perf/fsdp_overheads.py
    #: perf/dp_scaling.py amax_sync_fraction (docs/dp-scaling.md); "recorded": the catalog's recorded fit
    fp8_amax_sync_sigma: float | Literal["recorded"] | None = None
    dp_overlap_window: DpOverlapWindow | None = None  # perf/dp_scaling.py interleaved_exposed_s
    fp8_recipe: Fp8Recipe | None = None
    pp_p2p_overlap: bool | None = None  # perf/pipeline.py: an interleaved pipeline's sends under compute

    def apply(self, options: StepOptions) -> StepOptions:
        given = {name: value for name, value in asdict(self).items() if value is not None}
        if given.get("fp8_amax_sync_sigma") == RECORDED:
            given["fp8_amax_sync_sigma"] = None  # StepOptions' None: the judgement, the recorded fit
        return replace(options, **given)


def parse_model_terms(stragglers: str | None, straggler_scope: str | None, overlap_contention: str | None,
                      fsdp2_copies: bool | None, fp8_amax_sync: str | None = None,
                      dp_overlap_window: str | None = None, fp8_recipe: str | None = None,
                      overlap_pp: bool | None = None) -> ModelTerms:
    """The flags' values as given (None: not given, the term keeps StepOptions' default), checked: one line naming
    the flag when one is wrong."""
    if fp8_recipe is not None and fp8_recipe not in FP8_RECIPES:
        raise InputError(f"--fp8-recipe must be one of {', '.join(FP8_RECIPES)}, got {fp8_recipe!r}")
    if straggler_scope is not None and straggler_scope not in STRAGGLER_SCOPES:
        raise InputError(f"--straggler-scope must be job or replicas, got {straggler_scope!r}")
    sigma = None if stragglers is None else parse_fraction(stragglers, "--stragglers", most=MAX_STRAGGLER_SIGMA)
    amax_sigma, window = parse_dp_scaling_terms(fp8_amax_sync, dp_overlap_window)
    return ModelTerms(sigma, cast(StragglerScope | None, straggler_scope), _overlap_slowdown(overlap_contention),
                      fsdp2_copies, amax_sigma, window, cast(Fp8Recipe | None, fp8_recipe), overlap_pp)


def _overlap_slowdown(overlap_contention: str | None) -> float | None:
    """--overlap-contention: `measured` (the measured slowdown), `off` (0) or a fraction; None when not given."""
    if overlap_contention is None:
        return None
    word = overlap_contention.strip().lower()
    if word == MEASURED:
        return OVERLAP_COMPUTE_SLOWDOWN
    if word == OFF:
        return 0.0
    return parse_fraction(word, "--overlap-contention (or 'measured' or 'off')")


def parse_dp_scaling_terms(fp8_amax_sync: str | None, dp_overlap_window: str | None
                           ) -> tuple[float | Literal["recorded"] | None, DpOverlapWindow | None]:
    """--fp8-amax-sync (a spread, `0` for off, or `recorded`: the recorded fit) and --dp-overlap-window, checked:
    one line naming the flag when one is wrong; None for a flag not given."""
    if dp_overlap_window is not None and dp_overlap_window not in DP_OVERLAP_WINDOWS:
        raise InputError(f"--dp-overlap-window must be micro-batch or chunks, got {dp_overlap_window!r}")
    sigma: float | Literal["recorded"] | None
    if fp8_amax_sync is None:
        sigma = None
    elif fp8_amax_sync.strip().lower() == RECORDED:
        sigma = RECORDED
    else:
        sigma = parse_fraction(fp8_amax_sync, "--fp8-amax-sync (or 'recorded')", most=MAX_STRAGGLER_SIGMA)
    return sigma, cast(DpOverlapWindow | None, dp_overlap_window)
