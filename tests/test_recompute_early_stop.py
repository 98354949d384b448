"""What a full activation recompute re-runs, asked of PyTorch's own checkpoint code (and torchtitan's).

gpufleet prices a full recompute that "stops early" (catalog/stacks.py RecomputeEarlyStop, perf/compute.py
recompute_stops_early) as the layer's forward less its last GEMM, the MLP's down projection. These tests count the
matmuls PyTorch really runs in the backward of one checkpointed transformer-style block, on the CPU:

- no checkpoint: 2 per forward GEMM (input and weight gradients);
- a recompute that re-runs everything: 3 per forward GEMM;
- PyTorch's non-reentrant checkpoint with early stop (torch >= 2.1, its default): one fewer, the last GEMM, whose
  input autograd saves before the matmul runs, so the recompute stops before it;
- the same block with its GEMMs inside a custom autograd Function (how torchao's Float8Linear and Transformer
  Engine's Linear run FP8): every GEMM again, since such a Function saves its input only after it ran;
- the block compiled (AOT autograd's min-cut partitioner, as torch.compile runs it): the last GEMM is not re-run.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

HIDDEN = 32
FORWARD_GEMMS = 6  # q, k, v, out; up, down


class _CountMatmuls(TorchDispatchMode):
    """Counts the aten matmuls dispatched while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.matmuls = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.overloadpacket.__name__ in ("mm", "addmm", "bmm"):
            self.matmuls += 1
        return func(*args, **(kwargs or {}))


class _SavingMatmul(torch.autograd.Function):
    """x @ w.T in a custom autograd Function that saves its inputs inside forward (torchao's and TE's pattern)."""

    @staticmethod
    def forward(ctx: Any, x: Any, weight: Any) -> Any:
        ctx.save_for_backward(x, weight)
        return x @ weight.t()

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        x, weight = ctx.saved_tensors
        return grad @ weight, grad.flatten(0, -2).t() @ x.flatten(0, -2)


class _FunctionLinear(nn.Linear):
    def forward(self, x: Any) -> Any:
        return _SavingMatmul.apply(x, self.weight)


class _Block(nn.Module):
    """Pre-norm attention and MLP with residuals, the down projection last (as Llama's and MPT's blocks)."""

    def __init__(self, linear: type[nn.Linear] = nn.Linear) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.q, self.k, self.v, self.out = (linear(HIDDEN, HIDDEN, bias=False) for _ in range(4))
        self.up = linear(HIDDEN, 4 * HIDDEN, bias=False)
        self.down = linear(4 * HIDDEN, HIDDEN, bias=False)
        self.dropout = nn.Dropout(0.0)  # MPT's resid_pdrop 0: nothing saved after the down projection

    def forward(self, x: Any) -> Any:
        a = self.norm1(x)
        heads = [t(a).unsqueeze(1) for t in (self.q, self.k, self.v)]
        x = x + self.out(F.scaled_dot_product_attention(*heads, is_causal=True).squeeze(1))
        return x + self.dropout(self.down(F.gelu(self.up(self.norm2(x)))))


def _backward_matmuls(block: nn.Module, run: Any) -> int:
    x = torch.randn(2, 16, HIDDEN, requires_grad=True)
    y = run(block, x)
    counter = _CountMatmuls()
    with counter:
        y.sum().backward()
    return counter.matmuls


def test_without_checkpoint_backward_runs_two_matmuls_per_gemm() -> None:
    assert _backward_matmuls(_Block(), lambda b, x: b(x)) == 2 * FORWARD_GEMMS


def test_a_checkpoint_that_stops_early_does_not_rerun_the_last_gemm() -> None:
    stops = _backward_matmuls(_Block(), lambda b, x: checkpoint(b, x, use_reentrant=False))
    runs_all = _backward_matmuls(_Block(), lambda b, x: checkpoint(b, x, use_reentrant=False, early_stop=False))
    reentrant = _backward_matmuls(_Block(), lambda b, x: checkpoint(b, x, use_reentrant=True))
    assert runs_all == reentrant == 3 * FORWARD_GEMMS
    assert stops == 3 * FORWARD_GEMMS - 1  # the down projection is the one left out


def test_gemms_in_a_custom_autograd_function_are_all_rerun() -> None:
    stops = _backward_matmuls(_Block(_FunctionLinear), lambda b, x: checkpoint(b, x, use_reentrant=False))
    assert stops == 3 * FORWARD_GEMMS


def test_pytorchs_checkpoint_wrapper_stops_early_by_default() -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    wrapped = checkpoint_wrapper(_Block())
    assert _backward_matmuls(wrapped, lambda b, x: b(x)) == 3 * FORWARD_GEMMS - 1


def test_a_compiled_block_reruns_only_what_backward_reads() -> None:
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    backward_matmuls: list[int] = []

    def count_backward(graph: Any, _inputs: Any) -> Any:
        backward_matmuls.append(sum(1 for node in graph.graph.nodes if node.target in (
            torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default)))
        return make_boxed_func(graph)

    def backend(graph: Any, inputs: Any) -> Any:
        return aot_module_simplified(graph, inputs, fw_compiler=lambda g, _i: make_boxed_func(g),
                                     bw_compiler=count_backward, partition_fn=min_cut_rematerialization_partition)

    for linear in (nn.Linear, _FunctionLinear):  # in a compiled graph an FP8-style Function is traced through too
        block = _Block(linear)
        compiled = torch.compile(lambda x, b=block: checkpoint(b, x, use_reentrant=False), backend=backend)
        compiled(torch.randn(2, 16, HIDDEN, requires_grad=True)).sum().backward()
    assert backward_matmuls == [3 * FORWARD_GEMMS - 1] * 2


def test_torchtitan_0_3_full_ac_reruns_every_gemm() -> None:
    # the writer's target (gpufleet launch --target torchtitan) passes early_stop=False: the bare `torchtitan` stack
    # states no early stop, `torchtitan@0.1` (the published runs, before torchtitan #1580) does
    activation_checkpoint = pytest.importorskip("torchtitan.distributed.activation_checkpoint")
    full_ac = activation_checkpoint.FullAC(activation_checkpoint.FullAC.Config())
    wrapped = full_ac._wrap_block(_Block())
    assert _backward_matmuls(wrapped, lambda b, x: b(x)) == 3 * FORWARD_GEMMS
