"""Megatron-LM's own argument checks on the argument lists `launch --target megatron` writes.

For a matrix of plans (each the first plan the planner ranks with the named feature), the emitted arguments go
through Megatron-LM's parse_args() and validate_args(), its TransformerConfig is built from them, and its
micro-batch calculator divides the batch; the parsed args must carry the plan's layout and the catalog's model.

Megatron-LM's parser (megatron/training/arguments.py) is not on PyPI, so this runs only where MEGATRON_LM_DIR
points at a Megatron-LM checkout (see docs/launch.md for the tags it was run at and the result).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpufleet.catalog.records import ModelSpec
from gpufleet.catalog.registry import load_catalog
from gpufleet.emit.build import launch_spec
from gpufleet.emit.megatron import megatron_args, megatron_environment
from gpufleet.emit.spec import LaunchSpec
from gpufleet.parallel.layout import Layout, expert_parallel_degrees
from gpufleet.planner.plan import PlanRequest, make_plan
from gpufleet.planner.search import SearchSpace

CHECKOUT = os.environ.get("MEGATRON_LM_DIR")
HARNESS = Path(__file__).with_name("megatron_lm_harness.py")
pytestmark = [pytest.mark.timeout(900),
              pytest.mark.skipif(not CHECKOUT, reason="MEGATRON_LM_DIR is not set: point it at a Megatron-LM "
                                 "checkout (its megatron/training/arguments.py is not on PyPI) to run these")]

#: name -> (model, GPUs, request fields, what the plan must have); each row takes the best plan that has it
MATRIX: dict[str, tuple[str, int, dict[str, Any], Callable[[Layout], bool]]] = {
    "dense-tp-pp": ("llama3-70b", 64, {"search_space": SearchSpace(shardings=("none",), vpps=(1,))},
                    lambda lay: lay.tp > 1 and lay.pp > 1),
    "zero1": ("llama3-70b", 64, {"search_space": SearchSpace(shardings=("zero1",))},
              lambda lay: lay.sharding == "zero1"),
    "fsdp-zero3": ("llama3-8b", 64, {}, lambda lay: lay.sharding == "zero3"),
    "activation-offload": ("llama3-70b", 64, {}, lambda lay: bool(lay.offload_activation_layers)),
    "vpp": ("llama3-70b", 64, {}, lambda lay: lay.vpp > 1),
    "cp": ("llama3-8b", 64, {"seq_len": 16384}, lambda lay: lay.cp > 1),
    "moe-ep-etp": ("mixtral-8x7b", 128, {"search_space": SearchSpace(expert_tps=(None,))},
                   lambda lay: lay.ep > 1 and lay.tp > 1 and expert_parallel_degrees(lay)[0] > 1),
    "moe-qk-norm": ("qwen3-30b-a3b", 64, {}, lambda lay: lay.ep > 1),
    "mla-deepseek-v3": ("deepseek-v3", 1024, {}, lambda lay: lay.ep > 1),
    "fp8": ("llama3-70b", 64, {"precision": "fp8"}, lambda lay: lay.gpus == 64),
    # uneven pipeline splits (pp x vpp does not divide the layers): --pipeline-model-parallel-layout
    "uneven-405b-16384": ("llama3-405b", 16384, {}, lambda lay: 126 % (lay.pp * lay.vpp) != 0),
    # (bf16: megatron-core refuses MoE FP8 without Transformer Engine >= 1.7, which a CPU machine cannot install)
    "uneven-deepseek-v3": ("deepseek-v3", 2048, {}, lambda lay: 61 % (lay.pp * lay.vpp) != 0),
}


def _matrix_spec(name: str) -> LaunchSpec:
    model, gpus, request, wanted = MATRIX[name]
    result = make_plan(PlanRequest(model=model, tokens=1e11, gpus=gpus, top=60, **request), load_catalog([]))
    rank = next(i for i, plan in enumerate(result.plans, 1) if wanted(plan.layout))
    return launch_spec(result, rank)


def matrix_specs() -> dict[str, LaunchSpec]:
    return {name: _matrix_spec(name) for name in MATRIX}


def megatron_reads(checkout: str, specs: dict[str, LaunchSpec]) -> dict[str, Any]:
    """Megatron-LM's verdict on each spec's argument list (one subprocess for all of them)."""
    plans = {name: {"argv": megatron_args(spec), "world_size": spec.layout.gpus, "env": megatron_environment(spec)}
             for name, spec in specs.items()}
    done = subprocess.run([sys.executable, str(HARNESS), checkout], input=json.dumps(plans), capture_output=True,
                          text=True, timeout=800, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def specs() -> dict[str, LaunchSpec]:
    return matrix_specs()


@pytest.fixture(scope="module")
def verdicts(specs: dict[str, LaunchSpec]) -> dict[str, Any]:
    assert CHECKOUT
    return megatron_reads(CHECKOUT, specs)


def _parsed(verdicts: dict[str, Any], name: str) -> dict[str, Any]:
    verdict = verdicts[name]
    assert "error" not in verdict, f"Megatron-LM refuses the {name} plan: {verdict.get('error')}\n{verdict.get('log')}"
    return verdict["args"]  # type: ignore[no-any-return]


def _first(value: Any) -> Any:
    """Megatron's nargs='+' flags parse to a list of one value per MoE layer kind; one value here."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value


@pytest.mark.parametrize("name", list(MATRIX))
def test_megatron_lm_accepts_the_plan_and_runs_its_layout(name: str, specs: dict[str, LaunchSpec],
                                                          verdicts: dict[str, Any]) -> None:
    args, layout, job = _parsed(verdicts, name), specs[name].layout, specs[name].job
    assert MATRIX[name][3](layout)
    assert (args["tensor_model_parallel_size"], args["pipeline_model_parallel_size"], args["context_parallel_size"],
            args["data_parallel_size"]) == (layout.tp, layout.pp, layout.cp, layout.dp)
    assert args["expert_model_parallel_size"] == layout.ep
    assert args["expert_tensor_parallel_size"] == expert_parallel_degrees(layout)[0]
    assert args["virtual_pipeline_model_parallel_size"] == (layout.vpp if layout.vpp > 1 else None)
    assert args["sequence_parallel"] == (layout.sequence_parallel and layout.tp > 1)
    assert args["use_megatron_fsdp"] == (layout.sharding == "zero3")
    if layout.sharding == "zero3":
        assert (args["data_parallel_sharding_strategy"], args["ckpt_format"]) == ("optim_grads_params", "fsdp_dtensor")
    else:  # (Megatron-LM main turns the distributed optimizer on under FSDP itself)
        assert args["use_distributed_optimizer"] == (layout.sharding == "zero1")
    assert bool(args["cpu_offloading"]) == bool(layout.offload_activation_layers)
    assert args["cpu_offloading_num_layers"] == (layout.offload_activation_layers or 0)
    assert (args["micro_batch_size"], args["global_batch_size"], args["seq_length"]) == (
        layout.micro_batch, job.global_batch, job.seq_len)
    assert args["num_microbatches"] * layout.micro_batch * layout.dp == job.global_batch
    assert args["fp8"] == ("hybrid" if job.precision == "fp8" else None)
    assert args["bf16"] is True


def _check_attention(args: dict[str, Any], model: ModelSpec) -> None:
    assert args["multi_latent_attention"] == (model.mla is not None)
    if model.mla is not None:
        mla = model.mla
        assert (args["q_lora_rank"], args["kv_lora_rank"], args["qk_head_dim"], args["qk_pos_emb_head_dim"],
                args["v_head_dim"]) == (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_nope_head_dim,
                                        mla.qk_rope_head_dim, mla.v_head_dim)
        assert args["config_class"] == "MLATransformerConfig"
        assert args["rope_type"] == "rope" and args["apply_rope_fusion"] is False
    else:
        assert args["kv_channels"] == model.head_dim_
    groups = args["num_query_groups"] if args["group_query_attention"] else args["num_attention_heads"]
    assert groups == model.kv_heads
    assert args["qk_layernorm"] == model.qk_norm
    assert args["add_qkv_bias"] == model.qkv_bias


def _check_moe(args: dict[str, Any], model: ModelSpec) -> None:
    moe = model.moe
    if moe is None:
        assert args["num_experts"] is None
        return
    assert (args["num_experts"], args["moe_router_topk"], args["moe_ffn_hidden_size"]) == (
        moe.experts, moe.top_k, moe.expert_ffn_hidden)
    assert args["moe_shared_expert_intermediate_size"] == (moe.shared_experts * moe.expert_ffn_hidden or None)
    freq = args["moe_layer_freq"]
    assert (freq == 1) if not moe.dense_layers else freq == [0] * moe.dense_layers + [1] * (
        model.layers - moe.dense_layers)
    assert args["moe_expert_capacity_factor"] is None  # dropless: no token dropped, as the plan counts
    router = moe.router
    assert router is not None, f"{model.id}: the catalog records no router"
    assert args["moe_router_score_function"] == router.score_function
    assert args["moe_router_topk_scaling_factor"] == router.topk_scaling
    assert (args["moe_router_num_groups"], args["moe_router_group_topk"]) == (router.groups, router.group_topk)
    assert _first(args["moe_router_load_balancing_type"]) == router.load_balancing
    assert _first(args["moe_aux_loss_coeff"]) == router.aux_loss_coeff
    assert args["moe_router_enable_expert_bias"] == router.expert_bias
    if router.bias_update_rate is not None:
        assert args["moe_router_bias_update_rate"] == router.bias_update_rate


@pytest.mark.parametrize("name", list(MATRIX))
def test_megatron_lm_builds_the_catalogs_model(name: str, specs: dict[str, LaunchSpec],
                                               verdicts: dict[str, Any]) -> None:
    args, model = _parsed(verdicts, name), specs[name].job.model
    assert (args["num_layers"], args["hidden_size"], args["num_attention_heads"], args["vocab_size"]) == (
        model.layers, model.hidden, model.heads, model.vocab)
    if model.ffn_hidden is not None:  # else every layer is MoE (checked below) and the dense width is unused
        assert args["ffn_hidden_size"] == model.ffn_hidden
    assert args["position_embedding_type"] == "rope"
    assert model.rope_base is not None and args["rotary_base"] == model.rope_base
    assert model.norm_eps is not None and args["layernorm_epsilon"] == model.norm_eps  # --norm-epsilon
    assert args["normalization"] == {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[model.norm]
    assert (args["attention_dropout"], args["hidden_dropout"]) == (0.0, 0.0)
    assert args["untie_embeddings_and_output_weights"] == (not model.tied_embeddings)
    assert args["add_bias_linear"] == model.linear_bias
    assert args["swiglu"] == model.gated_mlp
    _check_attention(args, model)
    _check_moe(args, model)
