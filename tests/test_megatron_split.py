"""Megatron-LM builds the pipeline split gpufleet priced: an uneven split (pp x vpp does not divide the layers) is
written as --pipeline-model-parallel-layout (emit/megatron.py pipeline_layout), checked by hand and, where
megatron-core is installed, by its own build code: the TransformerConfig built from the emitted arguments, then
get_num_layers_to_build and get_transformer_layer_offset (what TransformerBlock calls) for every pipeline rank and
virtual stage give each rank the layers the step model priced (parallel/layout.py stage_layer_indices)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpufleet.catalog.registry import load_catalog
from gpufleet.emit.build import launch_spec
from gpufleet.emit.megatron import megatron_args, pipeline_layout
from gpufleet.parallel.layout import Layout, stage_layer_indices
from gpufleet.planner.plan import PlanRequest, make_plan

CATALOG = load_catalog([])


def test_the_layouts_by_hand() -> None:
    assert pipeline_layout(80, 8, 2) is None  # 16 chunks of 5: Megatron's own even split
    # 126 layers on 32 stages: 3 with the embedding, 30 of 4, 3 with the loss
    assert pipeline_layout(126, 32, 1) == "Et*3|(t*4|)*30t*3L"
    # 61 = 8 x 7 + 5: the five middle chunks after the first take the extra layer
    assert pipeline_layout(61, 8, 1) == "Et*7|(t*8|)*5t*7|t*7L"


#: (model, pp, vpp): Llama 3.1 405B on 16,384 GPUs (pp 32: the README's benchmark case, refused at model build
#: before) and its pp 15 and 8 x 4 splits, DeepSeek-V3's 61 layers on pp 8, and an even split on the legacy path
MATRIX = [("llama3-405b", 32, 1), ("llama3-405b", 15, 1), ("llama3-405b", 8, 4), ("llama3-405b", 64, 1),
          ("deepseek-v3", 8, 1), ("deepseek-v3", 4, 3), ("llama3-70b", 8, 2)]


def _args(model_id: str, pp: int, vpp: int) -> list[str]:
    base = launch_spec(make_plan(PlanRequest(model="llama3-8b", tokens=1e11, gpus=64, top=1), CATALOG), 1)
    spec = replace(base, job=replace(base.job, model=CATALOG.model(model_id)),
                   layout=Layout(pp=pp, vpp=vpp, dp=8, micro_batch=1))
    return megatron_args(spec)


@pytest.mark.framework
@pytest.mark.parametrize(("model_id", "pp", "vpp"), MATRIX)
def test_megatron_cores_own_layer_split_builds_the_planned_stages(monkeypatch: pytest.MonkeyPatch, model_id: str,
                                                                   pp: int, vpp: int) -> None:
    pytest.importorskip("megatron.core", reason="the launch-check extra (scripts/test installs it)")
    from megatron.core import parallel_state
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    from gpufleet.emit.read_megatron import parse_flags, transformer_config

    config = transformer_config(parse_flags(_args(model_id, pp, vpp)))
    assert config.pipeline_model_parallel_size == pp
    assert (config.virtual_pipeline_model_parallel_size or 1) == vpp
    layers = CATALOG.model(model_id).layers
    monkeypatch.setattr(parallel_state, "get_virtual_pipeline_model_parallel_world_size",
                        lambda: vpp if vpp > 1 else None)
    for rank in range(pp):
        monkeypatch.setattr(parallel_state, "get_pipeline_model_parallel_rank", lambda rank=rank: rank)
        built: list[int] = []
        for stage in range(vpp):
            vp_stage = stage if vpp > 1 else None
            offset = get_transformer_layer_offset(config, vp_stage, rank)
            built += range(offset, offset + get_num_layers_to_build(config, vp_stage, rank))
        assert tuple(built) == stage_layer_indices(layers, pp, vpp, rank), (model_id, rank)
