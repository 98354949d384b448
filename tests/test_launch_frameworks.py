"""The files `launch` writes, read by the frameworks' own parsers (the `launch-check` extra, pinned in
pyproject.toml): DeepSpeed's DeepSpeedConfig, torchtitan's ConfigManager and ParallelDims, megatron-core's
TransformerConfig (Megatron-LM's own argument parser is not on PyPI; see docs/launch.md). And the seeds' DeepSpeed
example, rejected by `launch --check` with each of its problems named."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from clirun import run_gpufleet
from gpufleet.catalog.records import ModelSpec
from gpufleet.catalog.registry import load_catalog
from gpufleet.emit.build import launch_spec
from gpufleet.emit.deepspeed import DEEPSPEED, ds_config
from gpufleet.emit.megatron import megatron_args
from gpufleet.emit.spec import LaunchSpec
from gpufleet.emit.torchtitan import TITAN_MODELS, TORCHTITAN
from gpufleet.planner.plan import PlanRequest, make_plan
from gpufleet.planner.search import SearchSpace
from gpufleet.workload.params import count_params

pytestmark = pytest.mark.timeout(600)
DATA = Path(__file__).parent / "data"


def _spec(model: str, gpus: int, space: SearchSpace | None = None, precision: str = "bf16", **request: object
          ) -> LaunchSpec:
    result = make_plan(PlanRequest(model=model, tokens=1e11, gpus=gpus, precision=precision,  # type: ignore[arg-type]
                                   search_space=space or SearchSpace(), top=20, **request), load_catalog([]))
    return launch_spec(result, 1)


# --- DeepSpeed ------------------------------------------------------------------------------------------------------

_DEEPSPEED_READS = textwrap.dedent("""
    import json, os, sys
    os.environ["DS_ACCELERATOR"] = "cpu"
    import deepspeed.comm as dist
    from deepspeed.runtime.config import DeepSpeedConfig
    dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)

    class DataParallel:  # the Megatron-style mpu DeepSpeed asks for the data-parallel size
        def __init__(self, size):
            self.size = size

        def get_data_parallel_world_size(self):
            return self.size

    for dp in sys.argv[2:]:
        try:
            config = DeepSpeedConfig(sys.argv[1], mpu=DataParallel(int(dp)))
        except AssertionError as error:
            print(json.dumps({"refused": str(error)}))
            continue
        print(json.dumps({"train_batch_size": config.train_batch_size,
                          "micro": config.train_micro_batch_size_per_gpu,
                          "accumulation": config.gradient_accumulation_steps,
                          "stage": config.zero_optimization_stage, "bf16": config.bfloat16_config.enabled}))
""")


def _deepspeed_reads(path: Path, *dps: int) -> subprocess.CompletedProcess[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
           "LOCAL_RANK": "0", "DS_BUILD_OPS": "0"}
    return subprocess.run([sys.executable, "-c", _DEEPSPEED_READS, str(path), *map(str, dps)], capture_output=True,
                          text=True, env=env, timeout=300, check=False)


def test_deepspeed_config_class_accepts_the_batch_arithmetic(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed", reason="the launch-check extra (scripts/test installs it)")
    spec = _spec("llama3-8b", 16, SearchSpace(max_tp=1, cps=(1,), vpps=(1,), activation_offload=False,
                                              shardings=("zero1",)))
    path = tmp_path / "ds_config.json"
    path.write_text(DEEPSPEED.render(spec)[0].text)
    read = _deepspeed_reads(path, spec.layout.dp, spec.layout.dp + 1)
    assert read.returncode == 0, read.stderr[-2000:]
    config, on_one_more = (json.loads(line) for line in read.stdout.strip().splitlines()[-2:])
    # by hand: the plan's global batch, its micro-batch, and accumulation = global / (micro x dp)
    assert config == {"train_batch_size": spec.job.global_batch, "micro": spec.layout.micro_batch,
                      "accumulation": spec.job.global_batch // (spec.layout.micro_batch * spec.layout.dp),
                      "stage": 1, "bf16": True}
    # the same file on one more data-parallel rank no longer multiplies out: DeepSpeed itself refuses it
    assert "train_batch_size is not equal" in on_one_more["refused"]


def test_every_emitted_deepspeed_key_is_one_deepspeed_reads() -> None:
    pytest.importorskip("deepspeed", reason="the launch-check extra (scripts/test installs it)")
    from gpufleet.emit.read_deepspeed import deepspeed_keys

    spec = _spec("llama3-8b", 16, SearchSpace(max_tp=1, cps=(1,), vpps=(1,), activation_offload=False))
    offloaded = replace(spec, layout=replace(spec.layout, pp=1, dp=16, sharding="zero3", offload_optimizer=True,
                                             recompute="full"))
    for each in (spec, offloaded):
        assert set(ds_config(each)) <= deepspeed_keys()
    assert {"data_parallel_size", "tensor_parallel_size", "pipeline_parallel_size"}.isdisjoint(deepspeed_keys())


def test_the_seeds_deepspeed_example_is_rejected_with_each_problem_named() -> None:
    """shared/seeds/000_*.txt: 'dp 2048, pp 2, tp 8' for two clusters of 1,024 GPUs, i.e. 2,048 GPUs."""
    pytest.importorskip("deepspeed", reason="the launch-check extra (scripts/test installs it)")
    result = run_gpufleet("launch", "--check", str(DATA / "seed_deepspeed.json"), "--gpus", "2048", "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    problems = " | ".join(report["problems"])
    assert report["consistent"] is False and len(report["problems"]) == 5, problems
    assert "degrees multiply to 32,768 GPUs" in problems  # 2048 x 2 x 8
    assert "4,096 / (4 × 2,048 dp) = 0.5, not a whole number" in problems
    assert "data_parallel_size, pipeline_parallel_size, tensor_parallel_size: not keys DeepSpeed" in problems
    assert "offload_param" in problems  # a string where DeepSpeed's ZeRO config wants {"device": "cpu"}
    assert "ZeRO stage 3 with pipeline parallelism 2" in problems
    assert result.stderr.startswith("error: 5 problem(s)") and len(result.stderr.splitlines()) == 1


_DEEPSPEED_TRAINS = textwrap.dedent("""
    import json, os, sys
    os.environ["DS_ACCELERATOR"] = "cpu"
    import torch, deepspeed

    for path in sys.argv[1:]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
        engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=path)
        x = torch.randn(engine.train_micro_batch_size_per_gpu(), 16, dtype=torch.bfloat16)
        for _ in range(engine.gradient_accumulation_steps()):  # one optimizer step
            engine.backward(engine(x).float().pow(2).mean())
            engine.step()
        print(json.dumps({"stage": engine.zero_optimization_stage(), "train_batch_size": engine.train_batch_size(),
                          "micro": engine.train_micro_batch_size_per_gpu(),
                          "accumulation": engine.gradient_accumulation_steps(), "bf16": engine.bfloat16_enabled(),
                          "clipping": engine.gradient_clipping(), "steps": engine.global_steps,
                          "optimizer": type(optimizer).__name__}))
""")


@pytest.mark.framework
def test_deepspeed_initialize_trains_a_step_with_the_file_on_one_cpu_rank(tmp_path: Path) -> None:
    """deepspeed.initialize (DS_ACCELERATOR=cpu, gloo, one rank) takes the written ds_config.json with a real torch
    module, at every ZeRO stage, and one optimizer step runs. One rank means dp 1, so the plan is the 16-GPU
    llama3-8b one with its data-parallel degree set to 1 and its global batch to micro x 2 accumulation steps;
    every other key is the writer's. (The first run on a machine JIT-builds DeepSpeed's shm comm op, minutes on two
    cores; torch_extensions caches it.)"""
    pytest.importorskip("deepspeed", reason="the launch-check extra (scripts/test installs it)")
    spec = _spec("llama3-8b", 16, SearchSpace(max_tp=1, cps=(1,), vpps=(1,), activation_offload=False))
    paths = []
    for sharding in ("none", "zero1", "zero2", "zero3"):
        one = replace(spec, layout=replace(spec.layout, dp=1, pp=1, sharding=sharding),
                      job=replace(spec.job, global_batch=spec.layout.micro_batch * 2))
        paths.append(tmp_path / f"ds_config_{sharding}.json")
        paths[-1].write_text(DEEPSPEED.render(one)[0].text)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
           "LOCAL_RANK": "0", "DS_BUILD_OPS": "0"}
    run = subprocess.run([sys.executable, "-c", _DEEPSPEED_TRAINS, *map(str, paths)], capture_output=True, text=True,
                         env=env, timeout=580, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    engines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    micro = spec.layout.micro_batch
    # DeepSpeed's own wrappers around the file's AdamW: bf16 at stage 0, ZeRO-1/2, ZeRO-3
    assert [e.pop("optimizer") for e in engines] == ["FP16_Optimizer", "DeepSpeedZeroOptimizer",
                                                     "DeepSpeedZeroOptimizer", "DeepSpeedZeroOptimizer_Stage3"]
    assert engines == [{"stage": stage, "train_batch_size": 2 * micro, "micro": micro, "accumulation": 2,
                        "bf16": True, "clipping": 1.0, "steps": 1} for stage in (0, 1, 2, 3)]


# --- torchtitan -----------------------------------------------------------------------------------------------------

def _titan_loads(tmp_path: Path, spec: LaunchSpec):  # type: ignore[no-untyped-def]
    from gpufleet.emit.read_torchtitan import load_config

    emitted = TORCHTITAN.render(spec)[0]
    path = tmp_path / Path(emitted.path).name
    path.write_text(emitted.text)
    return load_config(path, "gpufleet_job")


def test_torchtitan_config_manager_loads_the_job_and_parallel_dims_accept_it(tmp_path: Path) -> None:
    pytest.importorskip("torchtitan", reason="the launch-check extra (scripts/test installs it)")
    from gpufleet.emit.read_torchtitan import parallel_dims

    spec = _spec("llama3-8b", 64, stack="torchtitan")
    config = _titan_loads(tmp_path, spec)
    layout, p = spec.layout, config.parallelism
    assert (p.tensor_parallel_degree, p.pipeline_parallel_degree, p.context_parallel_degree) == (
        layout.tp, layout.pp, layout.cp)
    assert p.data_parallel_replicate_degree * p.data_parallel_shard_degree == layout.dp
    assert config.training.global_batch_size == spec.job.global_batch and config.training.seq_len == 4096
    assert config.training.steps == spec.train_iters
    assert (config.activation_checkpoint is None) == (layout.recompute == "none")
    dims = parallel_dims(config, 64)  # torchtitan's own check that the degrees fill the world
    assert dims.world_size == 64
    with pytest.raises(Exception, match="WORLD_SIZE"):
        parallel_dims(config, 72)


def test_torchtitan_full_recompute_loads(tmp_path: Path) -> None:
    """(A float8 job is not loaded here: torchtitan builds its Float8 converter while loading the config, which
    needs torchao and an SM89+ GPU.)"""
    pytest.importorskip("torchtitan", reason="the launch-check extra (scripts/test installs it)")
    spec = _spec("llama3-8b", 64, stack="torchtitan")
    full = replace(spec, layout=replace(spec.layout, recompute="full", recompute_layers=None))
    config = _titan_loads(tmp_path, full)
    assert type(config.activation_checkpoint).__qualname__.startswith("FullAC")
    fp8 = TORCHTITAN.render(replace(full, job=replace(full.job, precision="fp8")))[0].text
    assert "converters=[Float8LinearConverter.Config(model_compile_enabled=" in fp8


#: a plan per model the torchtitan writer supports, on enough GPUs for the catalog model to fit
_TITAN_GPUS = {"llama3-8b": 64, "llama3-70b": 256, "llama3-405b": 1024, "qwen3-30b-a3b": 64, "deepseek-v3": 1024}


def _built_shape(model: Any) -> dict[str, object]:
    """What a torchtitan model built on the meta device has, read off its modules and weight shapes."""
    blocks = list(model.layers.values())
    vocab, hidden = model.tok_embeddings.weight.shape
    attention = blocks[0].attention
    shape: dict[str, object] = {"layers": len(blocks), "hidden": hidden, "vocab": vocab, "heads": attention.n_heads,
                                "untied": model.lm_head.weight is not model.tok_embeddings.weight}
    if hasattr(attention, "kv_lora_rank"):  # MLA: no kv heads, low-rank projections instead
        shape["mla"] = (attention.q_lora_rank, attention.kv_lora_rank, attention.qk_nope_head_dim,
                        attention.qk_rope_head_dim, attention.v_head_dim)
    else:
        shape["kv_heads"], shape["head_dim"] = attention.n_kv_heads, attention.head_dim
    dense = [block for block in blocks if getattr(block, "moe", None) is None]
    if dense:
        shape["ffn"] = dense[0].feed_forward.w1.weight.shape[0]
    moe_blocks = [block.moe for block in blocks if getattr(block, "moe", None) is not None]
    if moe_blocks:
        experts, expert_ffn, _ = moe_blocks[0].routed_experts.inner_experts.w1_EFD.shape
        shared = moe_blocks[0].shared_experts
        shape["moe"] = (experts, moe_blocks[0].router.top_k, expert_ffn, len(dense),
                        0 if shared is None else shared.w1.weight.shape[0] // expert_ffn)
    return shape


def _catalog_shape(model: ModelSpec) -> dict[str, object]:
    shape: dict[str, object] = {"layers": model.layers, "hidden": model.hidden, "vocab": model.vocab,
                                "heads": model.heads, "untied": not model.tied_embeddings}
    if model.mla is not None:
        mla = model.mla
        shape["mla"] = (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim,
                        mla.v_head_dim)
    else:
        shape["kv_heads"], shape["head_dim"] = model.kv_heads, model.head_dim_
    moe = model.moe
    if moe is None or moe.dense_layers:
        shape["ffn"] = model.ffn_hidden
    if moe is not None:
        shape["moe"] = (moe.experts, moe.top_k, moe.expert_ffn_hidden, moe.dense_layers, moe.shared_experts)
    return shape


@pytest.mark.framework
@pytest.mark.parametrize("model_id", sorted(TITAN_MODELS))
def test_torchtitan_builds_the_catalogs_model_from_the_job(tmp_path: Path, model_id: str) -> None:
    """The job module, loaded by torchtitan's ConfigManager, builds (as torchtitan's Trainer builds it, on the meta
    device) the catalog's model: the same parameter count to the parameter, and the same shape."""
    pytest.importorskip("torchtitan", reason="the launch-check extra (scripts/test installs it)")
    from gpufleet.emit.read_torchtitan import meta_model

    spec = _spec(model_id, _TITAN_GPUS[model_id], stack="torchtitan")
    model = meta_model(_titan_loads(tmp_path, spec))
    assert all(p.is_meta for p in model.parameters())  # nothing allocated
    built = sum(p.numel() for p in model.parameters())  # parameters() counts a shared (tied) tensor once
    assert built == count_params(spec.job.model).total, f"{model_id}: torchtitan builds {built:,}"
    assert _built_shape(model) == _catalog_shape(spec.job.model)


def test_torchtitan_parameter_counts_are_the_catalogs_by_hand() -> None:
    """The counts the test above compares, written out (torchtitan 0.3.0 on the meta device gave the same)."""
    by_hand = {
        # 32 x (4096 x (4096 + 2 x 1024) + 4096^2 + 3 x 4096 x 14336 + 2 x 4096) + 2 x 128256 x 4096 + 4096
        "llama3-8b": 32 * (4096 * (4096 + 2 * 1024) + 4096 ** 2 + 3 * 4096 * 14336 + 2 * 4096)
                     + 2 * 128256 * 4096 + 4096,
        "llama3-70b": 80 * (8192 * (8192 + 2 * 1024) + 8192 ** 2 + 3 * 8192 * 28672 + 2 * 8192)
                      + 2 * 128256 * 8192 + 8192,
    }
    catalog = load_catalog([])
    assert by_hand == {"llama3-8b": 8_030_261_248, "llama3-70b": 70_553_706_496}
    for model_id, total in by_hand.items():
        assert count_params(catalog.model(model_id)).total == total
    assert [count_params(catalog.model(m)).total for m in ("llama3-405b", "qwen3-30b-a3b", "deepseek-v3")] == [
        405_853_388_800, 30_532_122_624, 671_026_404_352]


def test_a_bf16_405b_job_leaves_out_torchtitans_float8_converter() -> None:
    """torchtitan 0.3.0's llama3_405b() builds a Float8LinearConverter (torchao, SM89+) when called: a bf16 plan
    starts from llama3_70b() and sets what llama3_405b() sets instead; an fp8 plan keeps llama3_405b()."""
    spec = _spec("llama3-405b", 1024, stack="torchtitan")
    bf16 = TORCHTITAN.render(spec)[0].text
    assert "config = llama3_70b()" in bf16 and "llama3_405b" not in bf16.replace("llama3_405b()", "")
    assert "config.model_spec = model_registry('405B')" in bf16 and "Float8" not in bf16
    assert "config.hf_assets_path = './assets/hf/Llama-3.1-405B'" in bf16
    fp8 = TORCHTITAN.render(replace(spec, job=replace(spec.job, precision="fp8")))[0].text
    assert "config = llama3_405b()" in fp8 and "Float8LinearConverter.Config(" in fp8


# --- Megatron-LM ----------------------------------------------------------------------------------------------------

def test_megatron_arguments_build_megatron_cores_transformer_config() -> None:
    pytest.importorskip("megatron.core", reason="the launch-check extra (scripts/test installs it)")
    from gpufleet.emit.read_megatron import parse_flags, transformer_config

    for spec in (_spec("llama3-70b", 256), _spec("mixtral-8x7b", 64)):
        args = parse_flags(megatron_args(spec))
        config = transformer_config(args)
        layout, model = spec.layout, spec.job.model
        assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size,
                config.context_parallel_size, config.expert_model_parallel_size) == (
            layout.tp, layout.pp, layout.cp, layout.ep)
        assert (config.num_layers, config.hidden_size, config.num_attention_heads) == (
            model.layers, model.hidden, model.heads)
        assert config.sequence_parallel == (layout.sequence_parallel and layout.tp > 1)
        expected_vpp = layout.vpp if layout.vpp > 1 else None
        assert config.virtual_pipeline_model_parallel_size == expected_vpp
        assert int(args["global_batch_size"]) == int(args["micro_batch_size"]) * spec.gradient_accumulation * layout.dp
        if model.moe is not None:
            assert config.num_moe_experts == model.moe.experts and config.moe_router_topk == model.moe.top_k
    fp8 = megatron_args(replace(spec, job=replace(spec.job, precision="fp8")))
    assert {"--bf16", "--fp8-format=hybrid", "--fp8-recipe=delayed"} <= set(fp8)


def test_megatron_core_refuses_a_tensor_parallel_degree_the_heads_do_not_divide() -> None:
    pytest.importorskip("megatron.core", reason="the launch-check extra (scripts/test installs it)")
    from gpufleet.emit.read_megatron import parse_flags, transformer_config

    args = parse_flags(megatron_args(_spec("llama3-70b", 256)))
    with pytest.raises(ValueError, match="tensor_model_parallel_size"):
        transformer_config({**args, "tensor_model_parallel_size": "3"})  # 64 heads, 8 kv groups
