"""Does the planner rank layouts the way reality does? Scored on groups of measured runs that share
model, GPU type and GPU count but differ in layout (vTrain's 109 A100 runs are the reference set).

Per group: Spearman rank correlation between predicted and measured tokens/s; the measured-best
layout; the planner's pick (its fastest prediction among the group's layouts) and the regret
(measured step time of the pick / measured best − 1); and the overlap of the two top-3 sets.

Each group also gets a *smooth-model ceiling* (and that model's regret): the Spearman correlation reached by
a model that is told
each sub-group's (same tp, pp, cp, ep, vpp) per-sample work W and per-micro-batch cost c — fitted to the
measurements themselves, step = W·(m + (pp−1)/vpp)/m + c·(m + (pp−1)/vpp) over the m micro-batches — and
is otherwise smooth in micro-batch size. Sub-groups too small to fit keep their measured values (which favours
the reference). It is a least-squares fit, not a proof of an upper bound: a reference point for how much of the
group's ordering is scatter that no smooth dependence on micro-batch size reproduces.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufleet.planner.published_runs import PublishedRun
from gpufleet.planner.validate import RunPrediction

MIN_GROUP = 4


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rho (scipy.stats.spearmanr: the Pearson correlation of average ranks, ties sharing the mean
    rank); NaN when either side is constant (no order to compare), without scipy's warning."""
    from scipy.stats import spearmanr

    if len(set(xs)) < 2 or len(set(ys)) < 2:
        return float("nan")
    return float(spearmanr(xs, ys).statistic)


def smooth_model_fit(runs: list[PublishedRun]) -> list[float]:
    """Tokens/s per GPU of the per-sub-group two-parameter fit to the measurements (module docstring)."""
    step = np.array([1.0 / run.target.tokens_per_s_per_gpu for run in runs])  # ∝ step time within a group
    fitted = step.copy()
    subgroups: dict[tuple[object, ...], list[int]] = {}
    for index, run in enumerate(runs):
        layout = run.layout
        subgroups.setdefault((layout.tp, layout.pp, layout.cp, layout.ep, layout.vpp), []).append(index)
    for indices in subgroups.values():
        if len(indices) < 3:  # two parameters: a fit through two points is exact anyway
            continue
        columns = []
        for index in indices:
            run = runs[index]
            layout = run.layout
            dp, mb = layout.dp or 1, layout.micro_batch or 1
            micro_batches = (run.global_batch or dp * mb) / (dp * mb)
            slots = micro_batches + ((layout.pp or 1) - 1) / (layout.vpp or 1)
            columns.append((slots / micro_batches, slots))
        design = np.array(columns)
        solution, *_ = np.linalg.lstsq(design, step[indices], rcond=None)
        fitted[indices] = design @ solution
    return [1.0 / value for value in fitted]


def smooth_model_ceiling(runs: list[PublishedRun]) -> float:
    """Spearman between measured tokens/s and the smooth-model fit: what a smooth model can reach."""
    return spearman(smooth_model_fit(runs), [run.target.tokens_per_s_per_gpu for run in runs])


def group_key(run: PublishedRun) -> str:
    return f"{run.model.name} / {run.hardware.gpu} x {run.hardware.num_gpus}"


@dataclass(frozen=True, slots=True)
class GroupScore:
    """How well the planner ranks one group's layouts (module docstring: each figure)."""

    group: str
    runs: int
    spearman: float
    measured_best: str  # run id
    measured_best_layout: str
    pick: str  # run id of the planner's fastest prediction
    pick_layout: str
    regret: float  # measured step time of the pick / measured best - 1
    top3_overlap: float
    median_abs_error: float
    smooth_model_ceiling: float
    smooth_model_regret: float

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class SmallGroup:
    """A group with fewer than MIN_GROUP predicted runs: listed, not scored."""

    group: str
    runs: int


@dataclass(frozen=True)
class GroupRanking:
    """Ranking quality per group of same-model, same-GPU, same-count runs, and the groups too small to score."""

    groups: tuple[GroupScore, ...]
    skipped_groups: tuple[SmallGroup, ...]

    def as_dict(self) -> dict[str, Any]:
        """The `--json` form: {"groups": [...], "skipped_groups": [{"group", "runs"}]}."""
        return {"groups": [row.as_dict() for row in self.groups],
                "skipped_groups": [{"group": g.group, "runs": g.runs} for g in self.skipped_groups]}


def _score(key: str, members: list[tuple[PublishedRun, RunPrediction]]) -> GroupScore:
    measured = [run.target.tokens_per_s_per_gpu for run, _ in members]
    predicted = [p.predicted_tokens_per_s_per_gpu or 0.0 for _, p in members]
    best_measured = max(range(len(members)), key=lambda i: measured[i])
    pick = max(range(len(members)), key=lambda i: predicted[i])
    top_measured = set(sorted(range(len(members)), key=lambda i: -measured[i])[:3])
    top_predicted = set(sorted(range(len(members)), key=lambda i: -predicted[i])[:3])
    errors = [abs(p / m - 1) for p, m in zip(predicted, measured, strict=True)]
    smooth = smooth_model_fit([run for run, _ in members])
    return GroupScore(
        group=key, runs=len(members), spearman=spearman(predicted, measured),
        measured_best=members[best_measured][0].id, measured_best_layout=_layout_text(members[best_measured][1]),
        pick=members[pick][0].id, pick_layout=_layout_text(members[pick][1]),
        # Same global batch and sequence within a group: step time is inversely proportional to tokens/s.
        regret=measured[best_measured] / measured[pick] - 1,
        top3_overlap=len(top_measured & top_predicted) / 3, median_abs_error=statistics.median(errors),
        smooth_model_ceiling=spearman(smooth, measured),
        smooth_model_regret=measured[best_measured] / measured[int(np.argmax(smooth))] - 1,
    )


def rank_groups(runs: list[PublishedRun], predictions: list[RunPrediction]) -> GroupRanking:
    """Ranking quality per group of same-model, same-GPU, same-count runs; small groups are listed."""
    by_id = {p.id: p for p in predictions}
    groups: dict[str, list[tuple[PublishedRun, RunPrediction]]] = {}
    for run in runs:
        prediction = by_id[run.id]
        if prediction.predicted_tokens_per_s_per_gpu is None:
            continue
        groups.setdefault(group_key(run), []).append((run, prediction))
    return GroupRanking(tuple(_score(key, members) for key, members in groups.items() if len(members) >= MIN_GROUP),
                        tuple(SmallGroup(key, len(members)) for key, members in groups.items()
                              if len(members) < MIN_GROUP))


def _layout_text(prediction: RunPrediction) -> str:
    return prediction.layout.short() if prediction.layout else prediction.id
