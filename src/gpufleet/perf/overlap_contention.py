"""What a hidden collective costs the compute that hides it (docs/residuals.md).

The step model hides a collective behind compute when the compute window is long enough (`perf/step.py: _overlap`)
and then charges nothing for it. But the two share the GPU: NCCL's kernels hold SMs for the whole collective (an
H100 all-gather launches one block per channel, e.g. 24 of 132 SMs; a GEMM sized for 132 blocks then needs a second
wave), and both stream through HBM and draw power under the same cap. Lee et al., "Characterizing
Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning: Performance and Power Implications"
(arXiv 2507.03114, 2025), measured GPT and Llama training kernels on 4 A100, H100, MI250 and MI210 GPUs: compute
that overlaps communication runs on average 18.9 % slower (at most 40 %) than the same compute alone.

So each second of hidden communication stretches the compute under it by the slowdown:

    contention_s = slowdown x hidden collective seconds

(a collective longer than its window is hidden only for the window's length, which `_overlap` already caps). The
term is largest where most of the communication is hidden: FSDP, which gathers and reduces every layer under the
layer's compute. Megatron's data-parallel reduction hides under only the last micro-batch's backward.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet.errors import InputError

#: Lee et al. 2025 (arXiv 2507.03114), abstract: "overlapping computation and communication can result in an average
#: computational slowdown of 18.9 %, with a maximum of 40.0 %" (A100, H100, MI250, MI210; GPT and Llama).
OVERLAP_COMPUTE_SLOWDOWN = 0.189
#: The step parts whose hidden seconds are collectives running on the GPU's SMs beside compute (activation offload
#: rides the copy engines and the host link, the MoE host time is the CPU's: neither holds SMs).
COLLECTIVE_PARTS = ("comm.tp", "comm.cp", "comm.ep", "comm.dp", "comm.pp")


def contention_s(hidden_collective_s: Iterable[float], slowdown: float) -> float:
    """Seconds the compute loses to the collectives hidden under it: `slowdown` x their hidden seconds."""
    if slowdown < 0:
        raise InputError(f"overlap slowdown must be >= 0, got {slowdown}")
    return slowdown * sum(max(0.0, seconds) for seconds in hidden_collective_s)
