"""Megatron-LM: the `pretrain_gpt.py` argument list of a plan, one flag (with its value) per line.

Flag names are Megatron-LM's (megatron/training/arguments.py); the model-parallel ones map one to one onto
megatron-core's TransformerConfig fields, which is how the tests check them (see docs/launch.md).
"""

from __future__ import annotations

from gpufleet.emit.spec import EmittedFile, LaunchSpec, TargetCannotExpress
from gpufleet.parallel.layout import expert_parallel_degrees

ARGS_FILE = "megatron/pretrain_gpt.args"
#: Placeholder learning rate so the list runs as is (judgement: a common pre-training peak; set your own).
PLACEHOLDER_LR = 3.0e-4
#: Megatron-LM's FP8 recipe for FP8 GEMMs: E4M3 forward, E5M2 gradients ("hybrid"), delayed scaling (its default).
FP8_FORMAT, FP8_RECIPE = "hybrid", "delayed"


def _model_args(spec: LaunchSpec) -> list[str]:
    model = spec.job.model
    args = [f"--num-layers={model.layers}", f"--hidden-size={model.hidden}",
            f"--num-attention-heads={model.heads}", f"--seq-length={spec.job.seq_len}"]
    if model.ffn_hidden is not None:
        args.append(f"--ffn-hidden-size={model.ffn_hidden}")
    if model.head_dim is not None and model.head_dim != model.hidden // model.heads:
        args.append(f"--kv-channels={model.head_dim}")
    if model.kv_heads != model.heads:
        args += ["--group-query-attention", f"--num-query-groups={model.kv_heads}"]
    if model.learned_positions:
        args += ["--position-embedding-type=learned_absolute",
                 f"--max-position-embeddings={max(model.learned_positions, spec.job.seq_len)}"]
    else:
        args += ["--position-embedding-type=rope", f"--max-position-embeddings={spec.job.seq_len}"]
    args.append("--normalization=RMSNorm" if model.norm == "rmsnorm" else "--normalization=LayerNorm")
    if model.gated_mlp:
        args.append("--swiglu")
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not model.linear_bias:
        args.append("--disable-bias-linear")
    if model.qkv_bias:
        args.append("--add-qkv-bias")
    if model.qk_norm:
        args.append("--qk-layernorm")
    if model.moe is not None:
        args += _moe_args(spec)
    # mock data and a null tokenizer of the model's vocabulary: runs as a throughput check until you set yours
    args += ["--mock-data", "--tokenizer-type=NullTokenizer", f"--vocab-size={model.vocab}"]
    return args


def _moe_args(spec: LaunchSpec) -> list[str]:
    moe = spec.job.model.moe
    if moe is None:
        return []
    etp, _ = expert_parallel_degrees(spec.layout)
    args = [f"--num-experts={moe.experts}", f"--moe-router-topk={moe.top_k}",
            f"--moe-ffn-hidden-size={moe.expert_ffn_hidden}", "--moe-grouped-gemm",
            f"--expert-model-parallel-size={spec.layout.ep}", f"--expert-tensor-parallel-size={etp}",
            "--moe-token-dispatcher-type=" + ("flex" if spec.options.ep_dispatch == "dedup" else "alltoall")]
    if moe.shared_experts:
        args.append(f"--moe-shared-expert-intermediate-size={moe.shared_experts * moe.expert_ffn_hidden}")
    if moe.dense_layers:
        pattern = "[" + ",".join(["0"] * moe.dense_layers + ["1"] * (spec.job.model.layers - moe.dense_layers)) + "]"
        args.append(f"--moe-layer-freq={pattern}")
    if spec.options.ep_comm_overlap:
        args.append("--overlap-moe-expert-parallel-comm")
    return args


def _parallel_args(spec: LaunchSpec) -> list[str]:
    layout = spec.layout
    args = [f"--tensor-model-parallel-size={layout.tp}", f"--pipeline-model-parallel-size={layout.pp}",
            f"--context-parallel-size={layout.cp}"]
    if layout.vpp > 1:
        args.append(f"--num-virtual-stages-per-pipeline-rank={layout.vpp}")
    if layout.sequence_parallel and layout.tp > 1:
        args.append("--sequence-parallel")
    if layout.sharding == "hsdp":
        raise TargetCannotExpress("megatron", "hybrid-sharded data parallelism (HSDP) in gpufleet's Megatron-LM "
                                  "writer", ["torchtitan"])
    if layout.sharding == "zero1":
        args.append("--use-distributed-optimizer")
    elif layout.sharding in ("zero2", "zero3", "fsdp"):
        strategy = "optim_grads" if layout.sharding == "zero2" else "optim_grads_params"
        args += ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy={strategy}"]
    if spec.options.dp_overlap and layout.dp > 1:
        args.append("--overlap-grad-reduce")
        if layout.sharding != "none":
            args.append("--overlap-param-gather")
    if spec.options.tp_comm_overlap and layout.tp > 1:
        args.append("--tp-comm-overlap")
    return args


def _memory_args(spec: LaunchSpec) -> list[str]:
    layout = spec.layout
    args: list[str] = []
    if layout.recompute == "selective":
        args.append("--recompute-granularity=selective")
    elif layout.recompute == "full":
        # uniform with 1 layer per chunk recomputes every layer; block N recomputes the first N of each chunk
        method, count = ("uniform", 1) if layout.recompute_layers is None else ("block", layout.recompute_layers)
        args += ["--recompute-granularity=full", f"--recompute-method={method}", f"--recompute-num-layers={count}"]
    if layout.offload_optimizer:
        args += ["--optimizer-cpu-offload", "--use-precision-aware-optimizer"]
    if layout.offload_activation_layers:
        args += ["--cpu-offloading", f"--cpu-offloading-num-layers={layout.offload_activation_layers}"]
    return args


def _training_args(spec: LaunchSpec) -> list[str]:
    precision = spec.job.precision
    args = [f"--micro-batch-size={spec.layout.micro_batch}", f"--global-batch-size={spec.job.global_batch}",
            f"--train-iters={spec.train_iters}", f"--lr={PLACEHOLDER_LR}",
            "--fp16" if precision == "fp16" else "--bf16"]
    if precision == "fp8":
        args += [f"--fp8-format={FP8_FORMAT}", f"--fp8-recipe={FP8_RECIPE}"]
    args += [f"--save={spec.checkpoint_dir}", f"--load={spec.checkpoint_dir}",
             f"--save-interval={spec.checkpoint_interval_steps}"]
    return args


def megatron_args(spec: LaunchSpec) -> list[str]:
    """The whole `pretrain_gpt.py` argument list of the plan."""
    if spec.job.precision not in ("bf16", "fp16", "fp8"):
        raise TargetCannotExpress("megatron", f"{spec.job.precision} training recipe in gpufleet's writer", [])
    return [*_model_args(spec), *_parallel_args(spec), *_memory_args(spec), *_training_args(spec)]


class MegatronEmitter:
    name = "megatron"

    def render(self, spec: LaunchSpec) -> list[EmittedFile]:
        return [EmittedFile(ARGS_FILE, "\n".join(megatron_args(spec)) + "\n")]

    def entrypoint(self, spec: LaunchSpec, out_dir: str) -> tuple[str, ...]:
        """The program and arguments torchrun starts on each node (pretrain_gpt.py from Megatron-LM's checkout,
        with the same arguments as the written argument file)."""
        return ("pretrain_gpt.py", *megatron_args(spec))


MEGATRON = MegatronEmitter()
