"""Rules Megatron-LM enforces at start-up that bear on a plan, checked on an argument list without Megatron-LM.

Each rule was read from Megatron-LM's source at tag core_v0.16.1 (and holds at main d98e8a64, 2026-08-22); the
file it lives in is cited beside it. Each broken rule is one problem naming the flag to change. The arguments are
`read_megatron.parse_flags` output: argparse dests, values as text.
"""

from __future__ import annotations

import re
from typing import Any

TAG = "Megatron-LM core_v0.16.1"
ARGUMENTS = f"megatron/training/arguments.py, {TAG}"
CALCULATOR = f"megatron/core/num_microbatches_calculator.py, {TAG}"

#: flags people write that Megatron-LM's parser does not have (argparse exits on them: parse_args, ARGUMENTS), with
#: what to write instead
NOT_FLAGS: dict[str, str] = {
    "num_microbatches": "Megatron-LM derives the micro-batches per step as global / (micro × dp); set "
                        "--global-batch-size and --micro-batch-size instead",
    "gradient_accumulation_steps": "(a DeepSpeed key) Megatron-LM derives accumulation as global / (micro × dp); set "
                                   "--global-batch-size and --micro-batch-size instead",
    "cpu_offloading": "activation offload is --cpu-offloading-num-layers=N alone (Megatron-LM sets cpu_offloading "
                      "from it)",
    "recompute_interval": "use --recompute-granularity (selective or full) with --recompute-method and "
                          "--recompute-num-layers",
    "checkpoint_activations": "use --recompute-granularity=full (with --recompute-method)",
}


def _int(args: dict[str, Any], dest: str, default: int | None = None) -> int | None:
    value = args.get(dest)
    try:
        return int(value) if isinstance(value, str) else default
    except ValueError:
        return default


def not_flags(name: str, args: dict[str, Any]) -> list[str]:
    return [f"{name}: --{dest.replace('_', '-')} is not a Megatron-LM flag (its parser exits on it; {ARGUMENTS}): "
            f"{instead}" for dest, instead in NOT_FLAGS.items() if dest in args]


def fsdp_rules(name: str, args: dict[str, Any]) -> list[str]:
    """Megatron FSDP saves only fsdp_dtensor checkpoints, and that format only under Megatron FSDP (validate_args);
    --overlap-param-gather needs the distributed optimizer or FSDP, and --overlap-grad-reduce."""
    found = []
    fmt = args.get("ckpt_format")
    if args.get("use_megatron_fsdp") and fmt != "fsdp_dtensor":
        found.append(f"{name}: --use-megatron-fsdp needs --ckpt-format=fsdp_dtensor (Megatron FSDP saves only that "
                     f"checkpoint format; given: {fmt or 'the default, torch_dist'}; {ARGUMENTS})")
    if fmt == "fsdp_dtensor" and not args.get("use_megatron_fsdp"):
        found.append(f"{name}: --ckpt-format=fsdp_dtensor is for Megatron FSDP only: add --use-megatron-fsdp or "
                     f"choose another --ckpt-format ({ARGUMENTS})")
    if args.get("overlap_param_gather"):
        if not (args.get("use_distributed_optimizer") or args.get("use_megatron_fsdp")):
            found.append(f"{name}: --overlap-param-gather needs --use-distributed-optimizer or --use-megatron-fsdp "
                         f"({ARGUMENTS})")
        if not args.get("overlap_grad_reduce"):
            found.append(f"{name}: --overlap-param-gather needs --overlap-grad-reduce ({ARGUMENTS})")
    return found


def layout_chunks(layout: str) -> int:
    """Model chunks in a --pipeline-model-parallel-layout ('|'-separated after unrolling '(...)*n' and 'x*n', commas
    cosmetic: megatron-core core_v0.16.1 PipelineParallelLayerLayout.parse_str_to_list)."""
    text = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda match: match.group(1) * int(match.group(2)), text)
    return text.count("|") + 1


def parallel_rules(name: str, args: dict[str, Any]) -> list[str]:
    """Context, sequence and (virtual) pipeline parallelism preconditions of validate_args."""
    found = []
    tp, pp, cp = (_int(args, dest, 1) or 1 for dest in ("tensor_model_parallel_size",
                                                          "pipeline_model_parallel_size", "context_parallel_size"))
    seq, layers = _int(args, "seq_length"), _int(args, "num_layers")
    if cp > 1 and seq is not None and seq % (2 * cp):
        found.append(f"{name}: --seq-length {seq:,} is not a multiple of 2 × --context-parallel-size {cp} = {2 * cp} "
                     f"(each CP rank takes two chunks; {ARGUMENTS})")
    if args.get("tp_comm_overlap") and not args.get("sequence_parallel"):
        found.append(f"{name}: --tp-comm-overlap needs --sequence-parallel ({ARGUMENTS})")
    if args.get("sequence_parallel") and tp == 1:
        found.append(f"{name}: --sequence-parallel with --tensor-model-parallel-size 1: Megatron-LM turns it off "
                     f"(it splits along the tensor-parallel group); drop it or raise tp ({ARGUMENTS})")
    vpp = _int(args, "num_virtual_stages_per_pipeline_rank")
    layout = args.get("pipeline_model_parallel_layout")
    if isinstance(layout, str) and pp >= 1:
        chunks = layout_chunks(layout)
        if chunks % pp:
            found.append(f"{name}: --pipeline-model-parallel-layout has {chunks} chunks, not a multiple of "
                         f"--pipeline-model-parallel-size {pp} ({ARGUMENTS})")
        elif chunks > pp:
            vpp = chunks // pp
    if vpp is not None and _int(args, "num_layers_per_virtual_pipeline_stage") is not None:
        found.append(f"{name}: give one of --num-virtual-stages-per-pipeline-rank and "
                     f"--num-layers-per-virtual-pipeline-stage ({ARGUMENTS})")
    interleaved = (vpp or 1) > 1 or _int(args, "num_layers_per_virtual_pipeline_stage") is not None
    no_overlap = bool(args.get("no_overlap_p2p_communication"))  # p2p overlap is on unless this flag is given
    least = 3 if no_overlap else 2
    if interleaved and pp < least:
        found.append(f"{name}: the interleaved schedule needs --pipeline-model-parallel-size ≥ {least}"
                     f"{' with --no-overlap-p2p-communication (drop it for ≥ 2)' if no_overlap else ''}; given {pp}, "
                     f"or drop the virtual stages ({ARGUMENTS})")
    uneven_flags = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                    "pipeline_model_parallel_layout")
    if layers is not None and pp > 1 and layers % pp and not any(flag in args for flag in uneven_flags):
        found.append(f"{name}: --num-layers {layers} is not divisible by --pipeline-model-parallel-size {pp} "
                     f"({ARGUMENTS})")
    return found


def file_rules(name: str, args: dict[str, Any]) -> list[str]:
    """Every rule that needs the argument list alone."""
    return [*not_flags(name, args), *fsdp_rules(name, args), *parallel_rules(name, args)]


def batch_rules(name: str, args: dict[str, Any], dp: int) -> list[str]:
    """The micro-batch arithmetic: Megatron-LM runs global / (micro × dp) micro-batches per step
    (ConstantNumMicroBatchesCalculator, CALCULATOR, which also refuses a global batch that micro × dp does not
    divide; check._check_batch reports that one). A stated --num-microbatches or --gradient-accumulation-steps that
    disagrees with that count is named with the arithmetic."""
    micro, batch = _int(args, "micro_batch_size", 1) or 1, _int(args, "global_batch_size")
    if batch is None:
        return []
    per_step = micro * dp
    arithmetic = f"global / (micro × dp) = {batch:,} / ({micro} × {dp:,})"
    if batch % per_step:
        return []  # not whole: check._check_batch reports it for every framework
    derived = batch // per_step
    stated = {flag: value for flag in ("num_microbatches", "gradient_accumulation_steps")
              if (value := _int(args, flag)) is not None}
    wrong = {flag: value for flag, value in stated.items() if value != derived}
    if not wrong:
        return []
    said = " and ".join(f"--{flag.replace('_', '-')} {value}" for flag, value in stated.items())
    return [f"{name}: micro-batch arithmetic: {said} {'disagree' if len(stated) > 1 else 'disagrees'} with what "
            f"Megatron-LM runs, {arithmetic} = {derived} micro-batches per step ({CALCULATOR}); drop "
            f"{', '.join('--' + flag.replace('_', '-') for flag in wrong)} and set --global-batch-size to "
            f"micro × dp × the micro-batches you want"]


__all__ = ["NOT_FLAGS", "batch_rules", "file_rules"]
