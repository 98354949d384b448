"""torchtitan builds the pipeline split gpufleet priced: the settings the writer states (emit/torchtitan_split.py) are
checked by hand against torchtitan 0.3.0's arithmetic, and, where torchtitan is installed, its own functions on the
job file its own ConfigManager loads make the planned stages: pp x vpp of them, each rank's layers those the step
model priced (parallel/layout.py stage_layer_indices)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpufleet.catalog.registry import load_catalog
from gpufleet.emit.build import launch_spec
from gpufleet.emit.torchtitan import TORCHTITAN
from gpufleet.emit.torchtitan_split import titan_chunk_layer_counts, titan_split, titan_stage_count
from gpufleet.parallel.layout import Layout, chunk_layer_counts, stage_layer_indices
from gpufleet.planner.plan import PlanRequest, make_plan

CATALOG = load_catalog([])


def test_the_planned_chunks_by_hand() -> None:
    assert chunk_layer_counts(80, 16) == (5,) * 16
    # 126 = 32 x 3 + 30: the 30 middle chunks take one more, the embedding's and the head's chunks keep 3
    assert chunk_layer_counts(126, 32) == (3, *(4,) * 30, 3)
    assert chunk_layer_counts(61, 8) == (7, 8, 8, 8, 8, 8, 7, 7)  # 61 = 8 x 7 + 5: five middle chunks take one


def test_torchtitans_arithmetic_by_hand() -> None:
    # the refusal: 80 layers with 5 per stage and the default weights are ceil(82 / 5) = 17 stages
    assert titan_stage_count(80, 8, True, 5, 1, 1) is None
    # 82 effective layers over 16 stages: 6, 6, then 5 each; less one for the embedding and one for the head
    assert titan_chunk_layer_counts(16, 80, 1, 1) == (5, 6, *(5,) * 13, 4)
    assert titan_stage_count(80, 8, True, None, 1, 1) == 16  # Interleaved1F1B's default: two stages per rank
    assert titan_stage_count(126, 8, True, None, 1, 1) == 16  # ... whatever vpp the plan priced


@pytest.mark.parametrize(("layers", "pp", "vpp"), [(80, 8, 2), (80, 8, 1), (80, 4, 4), (126, 32, 1), (126, 8, 4),
                                                   (126, 16, 2), (126, 15, 1), (61, 8, 1), (61, 8, 2), (61, 4, 3),
                                                   (48, 4, 3), (32, 2, 8)])
def test_the_stated_settings_reproduce_the_planned_chunks(layers: int, pp: int, vpp: int) -> None:
    split = titan_split(layers, pp, vpp)
    planned = chunk_layer_counts(layers, pp * vpp)
    if split.module_fqns is not None:
        assert [sum(name.startswith("layers.") for name in chunk) for chunk in split.module_fqns] == list(planned)
        return
    stages = titan_stage_count(layers, pp, vpp > 1, split.layers_per_stage, split.first_stage_less_layers,
                               split.last_stage_less_layers)
    assert stages == pp * vpp
    assert titan_chunk_layer_counts(stages, layers, split.first_stage_less_layers,
                                    split.last_stage_less_layers) == planned


#: (model, pp, vpp): the torchtitan stack's 70B plan on 256 GPUs (pp 8 vpp 2); 405B's uneven splits: 126 layers on
#: 32 and on 15 stages, 8 ranks x 4 chunks, and 32 x 4 = 128 chunks whose first and last hold no layer; DeepSeek-V3's
#: 61 layers on pp 8 (and 4 x 3, which needs module lists)
MATRIX = [("llama3-70b", 8, 2), ("llama3-70b", 4, 4), ("llama3-405b", 32, 1), ("llama3-405b", 15, 1),
          ("llama3-405b", 32, 4), ("llama3-405b", 8, 4), ("deepseek-v3", 8, 1), ("deepseek-v3", 4, 3),
          ("qwen3-30b-a3b", 4, 3)]


def _job_file(tmp_path: Path, model_id: str, pp: int, vpp: int) -> Path:
    base = launch_spec(make_plan(PlanRequest(model="llama3-8b", tokens=1e11, gpus=64, stack="torchtitan", top=1),
                                 CATALOG), 1)
    job = replace(base.job, model=CATALOG.model(model_id))
    spec = replace(base, job=job, layout=Layout(pp=pp, vpp=vpp, dp=8, micro_batch=1))
    emitted = TORCHTITAN.render(spec)[0]
    path = tmp_path / f"{model_id}_{pp}_{vpp}" / Path(emitted.path).name
    path.parent.mkdir()
    path.write_text(emitted.text)
    return path


@pytest.mark.framework
@pytest.mark.parametrize(("model_id", "pp", "vpp"), MATRIX)
def test_torchtitans_own_split_builds_the_planned_stages(tmp_path: Path, model_id: str, pp: int, vpp: int) -> None:
    pytest.importorskip("torchtitan", reason="the launch-check extra (scripts/test installs it)")
    from torchtitan.distributed import pipeline_parallel as titan

    from gpufleet.emit.read_torchtitan import load_config

    config = load_config(_job_file(tmp_path, model_id, pp, vpp), "gpufleet_job")
    p = config.parallelism
    layers = CATALOG.model(model_id).layers
    stages, num_layers, first, last = titan._get_pipeline_metadata(  # torchtitan's own stage count
        SimpleNamespace(pp=pp), p, SimpleNamespace(layers=[None] * layers))
    names = p.module_fqns_per_model_part or titan._generate_llm_fqn_per_model_part(stages, num_layers, first, last)
    assert len(names) == pp * vpp
    for rank in range(pp):
        held = titan._get_pp_rank_to_stage_indices_mapping(rank, pp, p.pipeline_parallel_schedule, len(names))
        built = [int(name.split(".")[1]) for stage in held for name in names[stage] if name.startswith("layers.")]
        assert tuple(built) == stage_layer_indices(layers, pp, vpp, rank), (model_id, rank)
    assert {"tok_embeddings"} <= set(names[0]) and {"norm", "lm_head"} <= set(names[-1])
