"""Run in a subprocess by tests/test_megatron_lm.py: Megatron-LM's own parse_args() and validate_args() (and its
TransformerConfig built from the args, and its micro-batch calculator) on argument lists, one per plan.

Usage: python megatron_lm_harness.py CHECKOUT < {"name": {"argv": [...], "world_size": N, "env": {...}}, ...}
Prints one JSON object: name -> {"args": {...}} or {"error": "..."}.

Stubs, none of which changes what is validated: CUDA's device capability and properties read as an H100's (9.0;
the plans are for H100s, and validate_args asks for the architecture on this CPU-only torch); Python 3.11 gets
typing.override (Megatron-LM main imports it; it is new in 3.12). Without Transformer Engine (a CPU machine) the
TransformerConfig is built with the fused-RoPE kernel off, a kernel choice the parsed args still report as emitted.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import sys
import traceback
import typing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

#: parsed-args fields the test compares with the plan and the catalog
FIELDS = (
    "num_layers", "hidden_size", "num_attention_heads", "group_query_attention", "num_query_groups",
    "ffn_hidden_size", "kv_channels", "vocab_size", "seq_length", "max_position_embeddings",
    "position_embedding_type", "rotary_base", "rope_type", "normalization", "layernorm_epsilon", "swiglu",
    "attention_dropout", "hidden_dropout", "untie_embeddings_and_output_weights", "add_bias_linear", "add_qkv_bias",
    "qk_layernorm", "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
    "v_head_dim", "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
    "moe_layer_freq", "moe_router_score_function", "moe_router_topk_scaling_factor", "moe_router_num_groups",
    "moe_router_group_topk", "moe_router_load_balancing_type", "moe_aux_loss_coeff", "moe_router_enable_expert_bias",
    "moe_router_bias_update_rate", "moe_expert_capacity_factor", "moe_token_drop_policy",
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size", "data_parallel_size",
    "expert_model_parallel_size", "expert_tensor_parallel_size", "virtual_pipeline_model_parallel_size",
    "sequence_parallel", "use_distributed_optimizer", "use_megatron_fsdp", "data_parallel_sharding_strategy",
    "ckpt_format", "cpu_offloading", "cpu_offloading_num_layers", "recompute_granularity", "recompute_method",
    "recompute_num_layers", "fp8", "fp8_recipe", "bf16", "fp16", "micro_batch_size", "global_batch_size",
)


def _stub() -> None:
    import torch

    h100 = SimpleNamespace(major=9, minor=0, name="NVIDIA H100 80GB HBM3", total_memory=80 * 2**30)
    torch.cuda.get_device_capability = lambda device=None: (h100.major, h100.minor)  # type: ignore[assignment]
    torch.cuda.get_device_properties = lambda device=None: h100  # type: ignore[assignment]
    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override  # type: ignore[attr-defined]


def _one(argv: list[str], world_size: int, env: dict[str, str]) -> dict[str, Any]:
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.training.arguments import core_transformer_config_from_args, parse_args, validate_args

    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    os.environ.update(WORLD_SIZE=str(world_size), RANK="0", LOCAL_RANK="0", **env)
    sys.argv = ["pretrain_gpt.py", *argv]
    args = parse_args()
    validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})  # pretrain_gpt.py's defaults
    found = {name: getattr(args, name, None) for name in FIELDS}
    found["apply_rope_fusion"] = args.apply_rope_fusion
    if importlib.util.find_spec("transformer_engine") is None:
        args.apply_rope_fusion = False  # a kernel choice that needs Transformer Engine, absent on this CPU machine
    config = core_transformer_config_from_args(args)
    micro = ConstantNumMicroBatchesCalculator(args.global_batch_size, args.micro_batch_size, args.data_parallel_size,
                                              False, 0)
    found["config_class"] = type(config).__name__
    found["num_microbatches"] = micro.get()
    return found


def main() -> None:
    sys.path.insert(0, sys.argv[1])
    _stub()
    plans = json.load(sys.stdin)
    results: dict[str, Any] = {}
    for name, plan in plans.items():
        log = io.StringIO()
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                results[name] = {"args": _one(plan["argv"], plan["world_size"], plan["env"])}
        except BaseException as error:  # an assertion, a parser exit (SystemExit) or any other refusal
            where = traceback.extract_tb(error.__traceback__)[-1]
            results[name] = {"error": f"{type(error).__name__}: {error}",
                             "at": f"{Path(where.filename).name}:{where.lineno}", "log": log.getvalue()[-2000:]}
    print(json.dumps(results, default=str))


if __name__ == "__main__":
    main()
