"""Megatron-LM: the `pretrain_gpt.py` argument list of a plan, one flag (with its value) per line.

Flag names are Megatron-LM's (megatron/training/arguments.py); the model-parallel ones map one to one onto
megatron-core's TransformerConfig fields, which is how the tests check them (see docs/launch.md).
"""

from __future__ import annotations

import itertools

from gpufleet.catalog.records import RouterSpec
from gpufleet.emit.spec import EmittedFile, LaunchSpec, TargetCannotExpress
from gpufleet.parallel.layout import chunk_layer_counts, expert_parallel_degrees

ARGS_FILE = "megatron/pretrain_gpt.args"
ENV_FILE = "megatron/megatron.env"
#: the program torchrun starts on each node (Megatron-LM's GPT pre-training script, from its checkout)
PROGRAM = "pretrain_gpt.py"
#: Placeholder learning rate so the list runs as is (judgement: a common pre-training peak; set your own).
PLACEHOLDER_LR = 3.0e-4
#: Megatron-LM's FP8 recipe for FP8 GEMMs: E4M3 forward, E5M2 gradients ("hybrid"), delayed scaling (its default).
FP8_FORMAT, FP8_RECIPE = "hybrid", "delayed"
#: The signal that asks the trainer to save and exit: what job.sbatch passes on before the time limit (emit/slurm.py).
#: Megatron-LM takes it as --exit-signal-handler --exit-signal=SIGUSR1 (TrainingConfig.exit_signal_handler and
#: exit_signal, default SIGTERM, at core_v0.16.1 and main): each iteration its DistributedSignalHandler gathers
#: every rank's flag, and once any rank has the signal all of them save a checkpoint (--save) and exit with code 0.
EXIT_SIGNAL = "SIGUSR1"


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
    args += _position_args(spec) + _mla_args(spec) + _rope_fusion_args(spec)
    args.append("--normalization=RMSNorm" if model.norm == "rmsnorm" else "--normalization=LayerNorm")
    if model.norm_eps is not None:
        args.append(f"--norm-epsilon={model.norm_eps:g}")
    # the plan counts no dropout masks, and the catalog's models train without dropout (Megatron's default is 0.1)
    args += ["--attention-dropout=0.0", "--hidden-dropout=0.0"]
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


def _position_args(spec: LaunchSpec) -> list[str]:
    model = spec.job.model
    if model.learned_positions:
        return ["--position-embedding-type=learned_absolute",
                f"--max-position-embeddings={max(model.learned_positions, spec.job.seq_len)}"]
    args = ["--position-embedding-type=rope", f"--max-position-embeddings={spec.job.seq_len}"]
    if model.rope_base is not None:
        if model.rope_base != int(model.rope_base):
            raise TargetCannotExpress("megatron", f"RoPE base {model.rope_base:g} (--rotary-base takes an integer)",
                                      [])
        args.append(f"--rotary-base={int(model.rope_base)}")
    return args


def _mla_args(spec: LaunchSpec) -> list[str]:
    """Multi-latent attention with the catalog's ranks and head dimensions. Plain RoPE (--rope-type=rope):
    Megatron's MLA otherwise defaults to YaRN scaling (factor 40), which the catalog's model does not record."""
    mla = spec.job.model.mla
    if mla is None:
        return []
    return ["--multi-latent-attention", f"--q-lora-rank={mla.q_lora_rank}", f"--kv-lora-rank={mla.kv_lora_rank}",
            f"--qk-head-dim={mla.qk_nope_head_dim}", f"--qk-pos-emb-head-dim={mla.qk_rope_head_dim}",
            f"--v-head-dim={mla.v_head_dim}", "--rope-type=rope"]


def _rope_fusion_args(spec: LaunchSpec) -> list[str]:
    """Megatron's fused RoPE kernel takes MLA only with YaRN (MLATransformerConfig, megatron-core 0.16.1): plain RoPE
    under MLA runs unfused."""
    return ["--no-rope-fusion"] if spec.job.model.mla is not None else []


def _router_args(router: RouterSpec | None) -> list[str]:
    """The router as trained; without a record, Megatron's defaults (softmax, no balancing loss). Capacity:
    dropless unless the record gives a capacity factor."""
    if router is None:
        return []
    args = [f"--moe-router-score-function={router.score_function}",
            f"--moe-router-load-balancing-type={router.load_balancing}",
            f"--moe-aux-loss-coeff={router.aux_loss_coeff:g}"]
    if router.topk_scaling is not None:
        args.append(f"--moe-router-topk-scaling-factor={router.topk_scaling:g}")
    if router.groups is not None and router.group_topk is not None:
        args += [f"--moe-router-num-groups={router.groups}", f"--moe-router-group-topk={router.group_topk}"]
    if router.expert_bias:
        args.append("--moe-router-enable-expert-bias")
        if router.bias_update_rate is not None:
            args.append(f"--moe-router-bias-update-rate={router.bias_update_rate:g}")
    if router.capacity_factor is not None:
        args.append(f"--moe-expert-capacity-factor={router.capacity_factor:g}")
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
    args += _router_args(moe.router)
    if moe.shared_experts:
        args.append(f"--moe-shared-expert-intermediate-size={moe.shared_experts * moe.expert_ffn_hidden}")
    if moe.dense_layers:
        pattern = "[" + ",".join(["0"] * moe.dense_layers + ["1"] * (spec.job.model.layers - moe.dense_layers)) + "]"
        args.append(f"--moe-layer-freq={pattern}")
    if spec.options.ep_comm_overlap:
        args.append("--overlap-moe-expert-parallel-comm")
    return args


def pipeline_layout(layers: int, pp: int, vpp: int) -> str | None:
    """The planned split as Megatron-LM's --pipeline-model-parallel-layout, where Megatron's even split is not it
    (None: pp x vpp divides the layers). One chunk per '|', in model order (chunk c on rank c % pp, as megatron-core's
    PipelineParallelLayerLayout reads it), 'E' the embedding before the first chunk's layers, 'L' the loss after the
    last's, 't*n' n transformer layers, '(t*n|)*k' k such chunks in a row (core_v0.16.1 parse_str_to_list)."""
    chunks = pp * vpp
    if pp == 1 or layers % chunks == 0:
        return None
    counts = chunk_layer_counts(layers, chunks)
    middle: list[str] = []
    for count, run in ((count, len(list(group))) for count, group in itertools.groupby(counts[1:-1])):
        middle.append(f"(t*{count}|)*{run}" if run > 1 else f"t*{count}|")
    return f"Et*{counts[0]}|{''.join(middle)}t*{counts[-1]}L"


def _parallel_args(spec: LaunchSpec) -> list[str]:
    layout = spec.layout
    args = [f"--tensor-model-parallel-size={layout.tp}", f"--pipeline-model-parallel-size={layout.pp}",
            f"--context-parallel-size={layout.cp}"]
    uneven = pipeline_layout(spec.job.model.layers, layout.pp, layout.vpp)
    if uneven is not None:  # it sets the virtual stages too (validate_args: no other vpp flag beside it)
        args.append(f"--pipeline-model-parallel-layout={uneven}")
    elif layout.vpp > 1:
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
        # Megatron FSDP saves only the fsdp_dtensor checkpoint format (validate_args, Megatron-LM core_v0.16.1)
        args += ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy={strategy}", "--ckpt-format=fsdp_dtensor"]
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
        # the count is the flag: Megatron sets its cpu_offloading from it (--cpu-offloading is no command-line flag)
        args.append(f"--cpu-offloading-num-layers={layout.offload_activation_layers}")
    return args


def _training_args(spec: LaunchSpec) -> list[str]:
    precision = spec.job.precision
    args = [f"--micro-batch-size={spec.layout.micro_batch}", f"--global-batch-size={spec.job.global_batch}",
            f"--train-iters={spec.train_iters}", f"--lr={PLACEHOLDER_LR}",
            "--fp16" if precision == "fp16" else "--bf16"]
    if precision == "fp8":
        args += [f"--fp8-format={FP8_FORMAT}", f"--fp8-recipe={FP8_RECIPE}"]
    args += [f"--save={spec.checkpoint_dir}", f"--load={spec.checkpoint_dir}",
             f"--save-interval={spec.checkpoint_interval_steps}", "--exit-signal-handler",
             f"--exit-signal={EXIT_SIGNAL}"]
    return args


def megatron_args(spec: LaunchSpec) -> list[str]:
    """The whole `pretrain_gpt.py` argument list of the plan."""
    if spec.job.precision not in ("bf16", "fp16", "fp8"):
        raise TargetCannotExpress("megatron", f"{spec.job.precision} training recipe in gpufleet's writer", [])
    return [*_model_args(spec), *_parallel_args(spec), *_memory_args(spec), *_training_args(spec)]


def megatron_environment(spec: LaunchSpec) -> dict[str, str]:
    """What Megatron-LM asks of the environment for this layout: on GPUs before Blackwell, tensor or context
    parallelism without FSDP needs CUDA_DEVICE_MAX_CONNECTIONS=1 (one hardware queue, so communication kernels
    start in issue order; Blackwell does not need it and runs with it), and Megatron FSDP refuses it (validate_args,
    Megatron-LM core_v0.16.1 and main)."""
    layout = spec.layout
    fsdp = layout.sharding in ("zero2", "zero3", "fsdp")
    if (layout.tp > 1 or layout.cp > 1) and not fsdp:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    return {}


def command_environment(spec: LaunchSpec) -> dict[str, str]:
    """What the scheduler targets (job.sbatch, k8s.yaml) set for the training command they start: Megatron-LM's
    environment (megatron.env) when that command is pretrain_gpt.py, as `launch` fills it from the megatron target;
    nothing for another framework's command or a command given at submit time."""
    command = spec.train_command
    if command and command[0].rsplit("/", 1)[-1] == PROGRAM:
        return megatron_environment(spec)
    return {}


def _env_file(spec: LaunchSpec) -> str:
    lines = ["# Environment Megatron-LM requires for this layout (set it before pretrain_gpt.py; see docs/launch.md)"]
    lines += [f"{name}={value}" for name, value in megatron_environment(spec).items()]
    return "\n".join(lines) + "\n"


class MegatronEmitter:
    name = "megatron"

    def render(self, spec: LaunchSpec) -> list[EmittedFile]:
        files = [EmittedFile(ARGS_FILE, "\n".join(megatron_args(spec)) + "\n")]
        return [*files, EmittedFile(ENV_FILE, _env_file(spec))] if megatron_environment(spec) else files

    def environment(self, spec: LaunchSpec) -> dict[str, str]:
        """Variables the start command sets before torchrun (megatron.env holds the same)."""
        return megatron_environment(spec)

    def entrypoint(self, spec: LaunchSpec, out_dir: str) -> tuple[str, ...]:
        """The program and arguments torchrun starts on each node (pretrain_gpt.py from Megatron-LM's checkout,
        with the same arguments as the written argument file)."""
        return (PROGRAM, *megatron_args(spec))


MEGATRON = MegatronEmitter()
