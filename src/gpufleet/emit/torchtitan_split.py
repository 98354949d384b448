"""How a torchtitan job file states the pipeline split gpufleet priced (`chunk_layer_counts`: pp x vpp chunks,
chunk c on rank c % pp), so that torchtitan 0.3.0's own split (torchtitan/distributed/pipeline_parallel.py, read at
that tag) builds exactly those chunks.

torchtitan counts the embedding and the output as layers: with `pipeline_parallel_first_stage_less_layers` w1 and
`..._last_stage_less_layers` w2 (1 each by default) it splits L + w1 + w2 "effective" layers evenly over its stages,
the first stages taking the remainder, and the first stage holds w1 fewer transformer layers, the last w2 fewer. The
number of stages is `ceil((L + w1 + w2) / pipeline_parallel_layers_per_stage)` when that is set (a multiple of pp;
exactly pp under 1F1B, at least 2 pp under Interleaved1F1B), else pp (1F1B) or 2 pp (Interleaved1F1B). Stage s runs
on rank s % pp (the "loop" style of Interleaved1F1B and 1F1B).

`titan_split` finds the three settings whose arithmetic reproduces the planned chunks; where none does, the file
names every chunk's modules (`module_fqns_per_model_part`, which torchtitan takes as given).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from gpufleet.parallel.layout import chunk_layer_counts

#: torchtitan 0.3.0's defaults for the embedding's and the output's weight in the split (ParallelismConfig)
TITAN_DEFAULT_LESS_LAYERS = 1


@dataclass(frozen=True)
class TitanSplit:
    """The parallelism settings that make torchtitan build the planned chunks."""

    layers_per_stage: int | None  # None: torchtitan's default stage count is the planned one
    first_stage_less_layers: int
    last_stage_less_layers: int
    #: every chunk's modules, where no choice of the three settings reproduces the chunks (else None)
    module_fqns: tuple[tuple[str, ...], ...] | None = None


def titan_stage_count(layers: int, pp: int, interleaved: bool, layers_per_stage: int | None, first_less: int,
                      last_less: int) -> int | None:
    """The number of stages torchtitan's _get_pipeline_metadata makes, or None where it refuses the settings."""
    if layers_per_stage is None:
        return pp * (2 if interleaved else 1)
    stages = math.ceil((layers + first_less + last_less) / layers_per_stage)
    if stages % pp or (not interleaved and stages != pp) or (interleaved and stages < 2 * pp):
        return None
    return stages


def titan_chunk_layer_counts(stages: int, layers: int, first_less: int, last_less: int) -> tuple[int, ...] | None:
    """Transformer layers in each stage as torchtitan's _generate_llm_fqn_per_model_part assigns them, or None
    where it refuses (more stages than effective layers, an empty stage, a weight above the layers per stage)."""
    if stages == 1:
        return (layers,)
    effective = layers + first_less + last_less
    per_stage, extra = divmod(effective, stages)
    if stages > effective or per_stage == 0 or first_less > per_stage or last_less > per_stage:
        return None
    counts, left = [], layers
    for stage in range(stages):
        wanted = per_stage + (1 if stage < extra else 0)
        wanted -= first_less if stage == 0 else last_less if stage == stages - 1 else 0
        taken = min(wanted, left)
        counts.append(taken)
        left -= taken
    return tuple(counts)


def _layers_per_stage_choices(layers: int, stages: int, first_less: int, last_less: int) -> list[int]:
    """The settings of layers_per_stage that give exactly `stages` stages: ceil(E / lps) = stages."""
    effective = layers + first_less + last_less
    low = math.ceil(effective / stages)
    high = effective if stages == 1 else math.ceil(effective / (stages - 1)) - 1
    return list(range(low, high + 1))


@lru_cache(maxsize=1024)
def titan_split(layers: int, pp: int, vpp: int) -> TitanSplit:
    """The settings (torchtitan's defaults first, then the fewest changes) under which torchtitan builds the planned
    chunks of `layers` over pp ranks x vpp chunks; explicit module lists where none does."""
    planned, stages, interleaved = chunk_layer_counts(layers, pp * vpp), pp * vpp, vpp > 1
    default = TITAN_DEFAULT_LESS_LAYERS
    most = max(planned) + 1  # a weight above torchtitan's layers per stage is refused
    weights = sorted(((a, b) for a in range(most + 1) for b in range(most + 1)),
                     key=lambda w: (w != (default, default), abs(w[0] - default) + abs(w[1] - default), w))
    for first_less, last_less in weights:
        if titan_chunk_layer_counts(stages, layers, first_less, last_less) != planned:
            continue
        if titan_stage_count(layers, pp, interleaved, None, first_less, last_less) == stages:
            return TitanSplit(None, first_less, last_less)
        for per_stage in _layers_per_stage_choices(layers, stages, first_less, last_less):
            if titan_stage_count(layers, pp, interleaved, per_stage, first_less, last_less) == stages:
                return TitanSplit(per_stage, first_less, last_less)
    return TitanSplit(None, default, default, module_fqns=_module_fqns(planned))


def _module_fqns(planned: tuple[int, ...]) -> tuple[tuple[str, ...], ...]:
    """Each chunk's modules by torchtitan's names: the embedding in the first, the final norm and head in the last."""
    chunks: list[tuple[str, ...]] = []
    start = 0
    for index, count in enumerate(planned):
        names = [f"layers.{layer}" for layer in range(start, start + count)]
        if index == 0:
            names.insert(0, "tok_embeddings")
        if index == len(planned) - 1:
            names += ["norm", "lm_head"]
        chunks.append(tuple(names))
        start += count
    return tuple(chunks)
