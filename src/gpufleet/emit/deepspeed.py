"""DeepSpeed: the `ds_config.json` of a plan (batch arithmetic, ZeRO stage and offload, precision, AutoTP).

train_batch_size = train_micro_batch_size_per_gpu × gradient_accumulation_steps × dp, exactly, as DeepSpeed's own
config class checks against the data-parallel world size. Pipeline stages are not a ds_config key: the training
script builds `PipelineModule(num_stages=pp)` with the pp that `launch` reports.

Nor is which layers are recomputed: DeepSpeed recomputes the forward of what the training script wraps in
`deepspeed.checkpointing.checkpoint`, and ds_config.json (JSON: no comments) only says how the saved inputs are kept.
A plan that recomputes gets `deepspeed/README.txt` saying exactly what the script must wrap (`script_duties`), and
`launch` prints the same as a warning.
"""

from __future__ import annotations

import json
from typing import Any

from gpufleet.emit.spec import EmittedFile, LaunchSpec, TargetCannotExpress
from gpufleet.parallel.layout import chunk_layer_counts

CONFIG_FILE = "deepspeed/ds_config.json"
#: what the training script must do that ds_config.json cannot say (written only when there is something)
NOTES_FILE = "deepspeed/README.txt"
ZERO_STAGE = {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3, "hsdp": 3}
#: Placeholder optimizer so the config runs as is (judgement: AdamW at a common pre-training peak; set your own).
PLACEHOLDER_OPTIMIZER = {"type": "AdamW", "params": {"lr": 3.0e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}}
#: Gradient-norm clip (judgement: the value Llama 3, GPT-3 and most recipes use).
GRADIENT_CLIPPING = 1.0
STEPS_PER_PRINT = 10


def _refuse_what_it_lacks(spec: LaunchSpec) -> None:
    layout = spec.layout
    others = ["megatron", "torchtitan"]
    if layout.cp > 1:
        raise TargetCannotExpress("deepspeed", "context parallelism (ring attention over the sequence; "
                                  "DeepSpeed-Ulysses splits attention heads instead)", others)
    if layout.ep > 1:
        raise TargetCannotExpress("deepspeed", "expert-parallel degree in ds_config.json (DeepSpeed-MoE sets "
                                  "ep_size in model code)", others)
    if layout.vpp > 1:
        raise TargetCannotExpress("deepspeed", "interleaved (virtual-stage) pipeline schedule", others)
    if layout.pp > 1 and ZERO_STAGE[layout.sharding] >= 2:
        raise TargetCannotExpress("deepspeed", "ZeRO stage 2 or 3 with pipeline parallelism (its PipelineEngine "
                                  "allows ZeRO-1 at most)", others)
    if layout.sequence_parallel and layout.tp > 1:
        raise TargetCannotExpress("deepspeed", "sequence parallelism inside tensor parallelism (AutoTP shards "
                                  "weights only)", others)
    if spec.job.precision == "fp8":
        raise TargetCannotExpress("deepspeed", "FP8 training recipe in ds_config.json", others)
    if layout.offload_activation_layers:
        raise TargetCannotExpress("deepspeed", "offload of some layers' activations to CPU memory", ["megatron"])


def ds_config(spec: LaunchSpec) -> dict[str, Any]:
    """The ds_config dictionary of the plan."""
    _refuse_what_it_lacks(spec)
    layout = spec.layout
    stage = ZERO_STAGE[layout.sharding]
    zero: dict[str, Any] = {"stage": stage}
    if stage >= 2:
        zero["overlap_comm"] = spec.options.dp_overlap
    if layout.sharding == "hsdp":
        zero["zero_hpz_partition_size"] = layout.hsdp_group  # ZeRO++: parameters sharded inside a group
    if layout.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    config: dict[str, Any] = {
        "train_batch_size": spec.job.global_batch,
        "train_micro_batch_size_per_gpu": layout.micro_batch,
        "gradient_accumulation_steps": spec.gradient_accumulation,
        "bf16" if spec.job.precision == "bf16" else "fp16": {"enabled": True},
        "zero_optimization": zero,
        "gradient_clipping": GRADIENT_CLIPPING,
        "optimizer": PLACEHOLDER_OPTIMIZER,
        "steps_per_print": STEPS_PER_PRINT,
    }
    if layout.tp > 1:
        config["tensor_parallel"] = {"autotp_size": layout.tp}
    if layout.recompute != "none":
        # the model code calls deepspeed.checkpointing.checkpoint; this section says how it keeps what it saves
        config["activation_checkpointing"] = {"partition_activations": layout.tp > 1,
                                              "contiguous_memory_optimization": False}
    return config


def script_duties(spec: LaunchSpec) -> list[str]:
    """What the plan needs of the training script that ds_config.json cannot express, one sentence each: the
    recompute the step and memory were priced with (which layers' forward to wrap in
    deepspeed.checkpointing.checkpoint). Empty when the plan recomputes nothing."""
    layout, layers = spec.layout, spec.job.model.layers
    if layout.recompute == "none":
        return []
    wrap = "the training script must wrap in deepspeed.checkpointing.checkpoint"
    if layout.recompute == "selective":
        return [f"the plan recomputes selectively (each layer's core attention, the softmax over the scores, is "
                f"recomputed and the rest kept) and ds_config.json cannot say so: {wrap} each layer's core attention "
                "only, not the whole layer (DeepSpeed has no selective setting)"]
    if layout.recompute_layers is None:
        return [f"the plan recomputes the forward of all {layers} layers (full recompute) and ds_config.json cannot "
                f"say which layers: {wrap} every transformer layer's forward"]
    stages = chunk_layer_counts(layers, layout.pp) if layout.pp > 1 else (layers,)
    per_stage = [min(layout.recompute_layers, count) for count in stages]
    where = (f"the first {layout.recompute_layers} layers of the model" if layout.pp == 1 else
             f"the first {layout.recompute_layers} layers of each of the {layout.pp} pipeline stages")
    return [f"the plan recomputes the forward of exactly {sum(per_stage)} of the {layers} layers ({where}) and "
            f"ds_config.json cannot say which layers: {wrap} exactly those layers' forward and no others (the "
            "plan's memory and step time assume it)"]


def _notes_file(spec: LaunchSpec) -> str:
    lines = [f"# What gpufleet plan #{spec.rank} ({spec.layout.short()}) needs of your DeepSpeed training script",
             "# that ds_config.json cannot express (it is JSON: it has no comments).", ""]
    lines += [f"- {duty[0].upper()}{duty[1:]}." for duty in script_duties(spec)]
    return "\n".join(lines) + "\n"


class DeepSpeedEmitter:
    name = "deepspeed"

    def render(self, spec: LaunchSpec) -> list[EmittedFile]:
        files = [EmittedFile(CONFIG_FILE, json.dumps(ds_config(spec), indent=2) + "\n")]
        if script_duties(spec):
            files.append(EmittedFile(NOTES_FILE, _notes_file(spec)))
        return files

    def entrypoint(self, spec: LaunchSpec, out_dir: str) -> tuple[str, ...]:
        """Your training script and the config, named relative to the job folder (`out_dir` is not written into
        the command: job.sbatch and the printed start line put the folder in front, emit/start.py)."""
        return ("YOUR_TRAIN_SCRIPT.py", "--deepspeed_config", CONFIG_FILE)


DEEPSPEED = DeepSpeedEmitter()
