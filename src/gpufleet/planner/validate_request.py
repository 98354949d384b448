"""`gpufleet validate` as a request and its report: which runs, priced how, and what was found. The CLI parses flags
into a ValidateRequest, calls `validate_runs`, and prints the report (cli/validate.py); the Python API takes the same
request, so it refuses what the CLI refuses."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import model_validator

from gpufleet.catalog.judgements import ConstantFit
from gpufleet.catalog.registry import Catalog
from gpufleet.errors import InputError
from gpufleet.planner.model_terms import ModelTerms
from gpufleet.planner.published_runs import PublishedRun
from gpufleet.planner.validate import RunPrediction, Summary
from gpufleet.request import Request

if TYPE_CHECKING:  # numpy comes with the ranking, only when --rank asks for it
    from gpufleet.perf.step import StepOptions
    from gpufleet.planner.ranking import GroupRanking

#: What `validate` prints for vTrain's runs, which are in no fit and need their own cluster file.
VTRAIN_COMMAND = ("gpufleet validate --runs src/gpufleet/catalog/runs/vtrain_runs.yaml --catalog "
                  "tests/data/vtrain_cluster.yaml --node vtrain-a100-node --no-dp-overlap")


class ValidateRequest(Request):
    """Which runs `validate` predicts (None: every shipped run file the fits are fitted on) and with what."""

    runs: tuple[Path, ...] | None = None
    cross_validate: bool = False
    rank: bool = False
    node: str | None = None
    dp_overlap: bool = True
    terms: ModelTerms = ModelTerms()  # the step model's optional terms; None in each: StepOptions' default

    @model_validator(mode="after")
    def _refits_take_the_stacks_copies(self) -> ValidateRequest:
        if self.cross_validate and self.terms.fsdp2_copies is not None:
            raise InputError("--fsdp2-copies/--no-fsdp2-copies does not reach --cross-validate's refits yet: "
                             "leave it to each run's stack there")
        return self


@dataclass
class ValidateReport:
    """The runs, their predictions (with intervals), the summary, and the optional cross-validation and ranking;
    `data` is the --json document."""

    request: ValidateRequest
    loaded: list[PublishedRun]
    predictions: list[RunPrediction]
    summary: Summary
    data: dict[str, Any]
    ranking: GroupRanking | None = None

    @property
    def predicted_any(self) -> bool:
        return any(p.predicted_tokens_per_s_per_gpu for p in self.predictions)

    def failure(self) -> str | None:
        """Why nothing could be predicted (the check failed), or None."""
        if self.predicted_any:
            return None
        first = next((p for p in self.predictions if p.reason), self.predictions[0])
        return (f"none of the {len(self.loaded)} runs could be predicted (first: {first.id}: "
                f"{first.reason or 'skipped'})")


def load_request_runs(request: ValidateRequest, catalog: Catalog) -> list[PublishedRun]:
    """The runs of the request's files (every shipped fitted file by default), their stacks and ids checked, and the
    --node checked against them."""
    from gpufleet.planner.published_runs import check_run_stacks, check_unique_ids, fitted_run_paths, load_runs

    loaded: list[PublishedRun] = []
    for path in request.runs or fitted_run_paths():
        from_file = load_runs(path)
        check_run_stacks(from_file, catalog, path)
        loaded.extend(from_file)
    check_unique_ids(loaded)
    if request.node is not None:
        node_gpu = catalog.node(request.node).gpu  # unknown node: one line, exit 2
        if not any(run.hardware.gpu == node_gpu for run in loaded):
            used = sorted({run.hardware.gpu for run in loaded})
            raise InputError(f"--node {request.node} holds {node_gpu}, which none of the {len(loaded)} runs uses "
                             f"(they use {', '.join(used)}); give a node with one of those GPUs")
    return loaded


@dataclass(frozen=True)
class HeldOutScore:
    """The shipped runs in no fit (`*_holdout.yaml`), predicted as `validate` predicts the fitted ones: the
    out-of-sample check a user gets without asking."""

    files: tuple[str, ...]
    summary: Summary
    inside_interval: int  # predicted runs whose measurement lies inside their 80 % interval
    predicted: int
    #: runs of the files that a constant fit was chosen on (fits.yaml `constant_fits:` chosen_on): not scored here
    chosen_on: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        share = self.inside_interval / self.predicted if self.predicted else None
        return {"files": list(self.files), "summary": self.summary.as_dict(),
                "left_out_chosen_on": list(self.chosen_on),
                "interval": {"level": 0.8, "runs": self.predicted, "inside": self.inside_interval,
                             "coverage": share}}


def predict_runs(runs: list[PublishedRun], catalog: Catalog, options: StepOptions,
                 request: ValidateRequest) -> list[RunPrediction]:
    """Each run predicted with its own layout and stack under `options`, with its 80 % interval attached."""
    from gpufleet.planner.intervals import IntervalTable
    from gpufleet.planner.validate import attach_intervals, predict_run

    predictions = [predict_run(run, catalog, options, node_id=request.node, fsdp2_copies=request.terms.fsdp2_copies)
                   for run in runs]
    attach_intervals(predictions, IntervalTable.from_record(catalog.interval_table()))
    return predictions


def score_held_out(catalog: Catalog, options: StepOptions, request: ValidateRequest) -> HeldOutScore:
    """Predict every held-out run as the fitted ones are predicted, leaving out those a constant fit was chosen on
    (the FP8 amax spread's DGX Cloud series); summarise and count interval hits."""
    from gpufleet.planner.published_runs import held_out_run_paths
    from gpufleet.planner.validate import summarize

    paths = held_out_run_paths()
    fitted = {run_id for record in catalog.records("constant_fits").values() if isinstance(record, ConstantFit)
              for run_id in record.chosen_on}
    loaded = load_request_runs(request.model_copy(update={"runs": tuple(paths)}), catalog)
    runs = [run for run in loaded if run.id not in fitted]
    predictions = predict_runs(runs, catalog, options, request)
    hits = [p.interval.low <= p.target_tokens_per_s_per_gpu <= p.interval.high
            for p in predictions if p.predicted_tokens_per_s_per_gpu and p.interval is not None]
    return HeldOutScore(tuple(path.name for path in paths), summarize(predictions), sum(hits), len(hits),
                        tuple(run.id for run in loaded if run.id in fitted))


def validate_runs(request: ValidateRequest, catalog: Catalog) -> ValidateReport:
    """Predict every run with its own layout and stack, attach its interval, summarise, and (as asked)
    cross-validate the fits and score the ranking."""
    from gpufleet.perf.step import StepOptions
    from gpufleet.planner.validate import summarize

    loaded = load_request_runs(request, catalog)
    terms = request.terms
    options = terms.apply(StepOptions(dp_overlap=request.dp_overlap))  # fsdp2_copies None: each run's stack
    predictions = predict_runs(loaded, catalog, options, request)
    summary = summarize(predictions)
    data: dict[str, Any] = {"runs": [p.as_dict() for p in predictions], "summary": summary.as_dict(),
                            "options": {"straggler_sigma": options.straggler_sigma,
                                        "straggler_scope": options.straggler_scope,
                                        "overlap_slowdown": options.overlap_slowdown,
                                        "fsdp2_copies": terms.fsdp2_copies,
                                        "fp8_amax_sync_sigma": options.resolved_fp8_amax_sync_sigma,
                                        "dp_overlap_window": options.dp_overlap_window,
                                        "pp_p2p_overlap": options.pp_p2p_overlap}}
    if not request.runs:
        data["validated_apart"] = {"vtrain": VTRAIN_COMMAND}
        if request.node is None:  # a --node names the measured cluster of the fitted files' runs, not these
            data["held_out"] = score_held_out(catalog, options, request).as_dict()
    if request.cross_validate:
        from gpufleet.planner.fit import cross_validate as leave_one_source_out

        data["cross_validated"] = leave_one_source_out(loaded, predictions, catalog, options,
                                                       request.node).summary(loaded, predictions)
    ranking = None
    if request.rank:
        from gpufleet.planner.ranking import rank_groups

        ranking = rank_groups(loaded, predictions)
        data["ranking"] = ranking.as_dict()
    return ValidateReport(request, loaded, predictions, summary, data, ranking)
