"""HBM traffic that PyTorch FSDP2 (`fully_shard`) adds around its collectives, on the compute stream
(docs/residuals.md).

FSDP2 shards every parameter on its own (per-parameter DTensor sharding) and all-gathers a module's parameters
as one flat buffer. Two copies follow from that layout, and both run on the *current* (compute) stream, so they
add to the step instead of hiding behind it (PyTorch `torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py`):

* `foreach_all_gather_copy_out`: the current stream waits for the all-gather's event, then
  `split_with_sizes_copy` copies the flat all-gather output into each parameter's unsharded tensor: it reads and
  writes every unsharded element once, 2 x the gather dtype's bytes per parameter, at every all-gather (the
  forward's and, when the module was resharded after the forward, the backward's);
* `foreach_reduce_scatter_copy_in`: before the reduce-scatter, the unsharded gradients are `chunk_cat`-ed (and
  cast to the reduce dtype) into one flat input, on the current stream (the reduce-scatter stream waits for it):
  it reads each gradient in the parameter dtype and writes it in the reduce dtype.

The shard-sized copies (the all-gather copy-in, the reduce-scatter copy-out) move 1/dp of that and are left out.
FSDP1's flat parameters need neither large copy (the all-gather writes the flat parameter in place, and its
gradient is already one flat tensor), nor do Megatron's contiguous buffers: the term is for FSDP2 stacks only.

Per micro-batch and unsharded local parameter (torchtitan: bf16 parameters, fp32 reduce):

    bytes = 2·p (forward gather) + 2·p (backward re-gather, if resharded) + (p + r) (reduce-scatter input)
          = 4 + 4 + 6 = 14 B

and the seconds are bytes / (HBM bandwidth x the calibration's HBM fraction), the same rate every other streaming
kernel in the model gets.
"""

from __future__ import annotations

#: The all-gather copy-out reads the flat output and writes the parameter's tensor: two passes of the gather dtype.
COPY_OUT_PASSES = 2


def fsdp2_copy_bytes_per_param(param_bytes: float, reduce_bytes: float, *, regathered_in_backward: bool) -> float:
    """HBM bytes FSDP2's copy-out (each all-gather) and reduce-scatter copy-in move per unsharded parameter per
    micro-batch: `param_bytes` is the gather (parameter) dtype's size, `reduce_bytes` the reduce dtype's."""
    gathers = 2 if regathered_in_backward else 1
    return gathers * COPY_OUT_PASSES * param_bytes + param_bytes + reduce_bytes


def fsdp2_copy_s(local_params: float, micro_batches: int, *, param_bytes: float, reduce_bytes: float,
                 regathered_in_backward: bool, hbm_bytes_per_s: float, hbm_fraction: float) -> float:
    """Seconds per step the copies add on the compute stream: `local_params` unsharded parameters of this GPU (after
    tp/ep, before FSDP's sharding), gathered and reduced once per micro-batch."""
    if local_params <= 0 or micro_batches <= 0:
        return 0.0
    per_param = fsdp2_copy_bytes_per_param(param_bytes, reduce_bytes, regathered_in_backward=regathered_in_backward)
    return micro_batches * local_params * per_param / (hbm_bytes_per_s * hbm_fraction)
