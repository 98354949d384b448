"""The workload, cluster and framework options `plan` and `launch` share (and the step model's optional terms,
which `validate` takes too), defined once; planner/plan_options.py checks their values."""

from __future__ import annotations

import typer

from gpufleet.fabric.topology import TOPOLOGY_KINDS

ModelOption = typer.Option("llama3-8b", "--model", "-m", help="Model id (gpufleet catalog list models).")
TokensOption = typer.Option("1T", "--tokens", "-t", help="Training tokens, e.g. 15T, 300B.")
GpuOption = typer.Option(None, "--gpu", "-g", help="GPU id (gpufleet catalog list gpus) [default: the --node's GPU, "
                         "else h100-sxm].")
GpusOption = typer.Option("64", "--gpus", "-n",
                          help="GPU count; a list 64,128 or a range sweeps the scale: 64-1024 doubles "
                          "from 64 (64, 128, … 1024; the top end always included), 64-512:64 steps by 64.")
NodeOption = typer.Option(None, "--node", help="Node id; default: the catalog's node for the GPU.")
FabricOption = typer.Option(None, "--fabric", "--network",
                            help="Scale-out network id (ndr400, roce200, socket …); default: the node's.")
TopologyOption = typer.Option("fat-tree", "--topology", help=f"One of {', '.join(TOPOLOGY_KINDS)}.")
OversubscriptionOption = typer.Option("1:1", "--oversubscription", help="Leaf down:up ratio, e.g. 4:1.")
SeqOption = typer.Option(4096, "--seq", help="Sequence length in tokens.")
GlobalBatchOption = typer.Option(None, "--global-batch",
                                 help="Sequences per step; default ~4M tokens per step, at least one "
                                 "sequence per GPU (so a sweep past 1,024 GPUs at 4K raises it).")
PrecisionOption = typer.Option("bf16", "--precision", help="bf16, fp16 or fp8 (fp8 GEMMs).")
RankByOption = typer.Option("time", "--rank-by", help="time (time-to-train) or cost (cheapest cloud).")
FabricModelOption = typer.Option("analytical", "--fabric-model",
                                 help="analytical (α–β, fast) or sim: re-time the top plans' collectives "
                                 "with the flow-level simulator on the topology graph.")
OverlapTpOption = typer.Option(None, "--overlap-tp/--no-overlap-tp", help="The framework hides "
                               "tensor-parallel communication behind GEMMs (Megatron's --tp-comm-overlap, "
                               "userbuffers) [default: off, or the --stack's].")
DtensorTpOption = typer.Option(None, "--dtensor-tp/--megatron-tp", help="Tensor parallelism as PyTorch "
                               "DTensor runs it (torchtitan without AsyncTP): backward collectives in line "
                               "and, under sequence parallelism, the gathered GEMM inputs kept; or as "
                               "Megatron runs it: the input-gradient reduction under the weight-gradient "
                               "GEMM, only the shard kept [default: Megatron, or the --stack's].")
OverlapEpOption = typer.Option(None, "--overlap-ep/--no-overlap-ep", help="The expert all-to-all "
                               "runs while another micro-batch computes (DualPipe, Megatron-Core's "
                               "EP overlap) [default: off, or the --stack's].")
OverlapDpOption = typer.Option(None, "--overlap-dp/--no-overlap-dp", help="The data-parallel gradient "
                               "reduce-scatter/all-reduce and parameter all-gather run under compute "
                               "(Megatron's --overlap-grad-reduce/--overlap-param-gather, DeepSpeed's "
                               "overlap_comm, FSDP prefetch); --no-overlap-dp: they run after the backward, in "
                               "line [default: on].")
OverlapPpOption = typer.Option(None, "--overlap-pp/--no-overlap-pp", help="An interleaved pipeline's (vpp > 1) "
                               "stage-boundary sends and receives run while the next chunk computes (Megatron-LM's "
                               "overlap_p2p_comm, NeMo 2 and Megatron-Bridge with vpp > 1); --no-overlap-pp: every "
                               "send-recv in line (comm.pp in --explain; docs/model.md) [default: on, or the "
                               "--stack's].")
EpDispatchOption = typer.Option(None, "--ep-dispatch", help="all-to-all (one copy per routed expert; "
                                "the default) or dedup (a token is sent once per destination "
                                "node over the network and once per destination GPU inside a node: "
                                "DeepEP, HybridEP).")
SelectivePolicyOption = typer.Option(None, "--selective-policy", help="What selective recompute keeps: "
                                     "attention (Megatron: all but the attention core; the default) or op "
                                     "(torchtitan's op-level checkpointing: every second matmul output).")
EagerOption = typer.Option(False, "--eager", help="Element-wise ops run as eager PyTorch, one kernel each "
                           "with an fp32 RMSNorm (torchtitan without torch.compile) [default: fused kernels, "
                           "as Transformer Engine and torch.compile run them].")
StackOption = typer.Option(None, "--stack", help="Plan for a framework's documented settings (attention "
                           "kernel, overlaps, gradient dtype, recompute policy) and without the features it "
                           "lacks (SP, CP, activation offload): a catalog stack id (`gpufleet catalog list "
                           "stacks`: megatron-core, megatron-bridge, nemo, torchtitan, ...). Explicit flags "
                           "override its settings. Default: Megatron-LM's defaults.")
# The step model's optional terms (planner/model_terms.py), shared with `validate`.
StragglersOption = typer.Option(None, "--stragglers", metavar="SIGMA", help="Wait for the slowest GPU: per-GPU "
                                "speed spreads with relative standard deviation SIGMA (e.g. 0.015 or 1.5%, the "
                                "measured spread; at most 20%) and each step waits for the slowest of the job's "
                                "GPUs (sync.stragglers in --explain; docs/dp-scaling.md) [default: off].")
StragglerScopeOption = typer.Option(None, "--straggler-scope", help="With --stragglers: job (the step waits "
                                    "for the slowest of all GPUs, against a median GPU) or replicas (only what "
                                    "data parallelism adds over one replica of tp*pp*cp GPUs) [default: job].")
OverlapContentionOption = typer.Option(None, "--overlap-contention", metavar="FRACTION|measured|off", help="Compute "
                                       "that runs under a hidden collective runs FRACTION slower (e.g. 0.1 or "
                                       "10%; `measured`: the measured 18.9 %, Lee et al. 2025; `off` or 0: hidden "
                                       "collectives are free); compute.overlap-contention in --explain "
                                       "(docs/residuals.md) [default: measured].")
Fsdp2CopiesOption = typer.Option(None, "--fsdp2-copies/--no-fsdp2-copies", help="Price FSDP2's all-gather "
                                 "copy-out and reduce-scatter copy-in on the compute stream for fully sharded "
                                 "layouts (fsdp.copies in --explain; docs/residuals.md) [default: the --stack's: "
                                 "on for stacks that run fully_shard, such as torchtitan; else off].")
Fp8AmaxSyncOption = typer.Option(None, "--fp8-amax-sync", metavar="SIGMA|recorded|0", help="FP8 delayed "
                                 "scaling's amax all-reduce spans the data-parallel replicas: the pipeline waits for "
                                 "the slowest of dp at each one, replica times spreading by SIGMA (e.g. 2%; 0: off); "
                                 "only where the FP8 recipe is delayed scaling over tp x dp x cp (--fp8-recipe, the "
                                 "stack's); sync.fp8-amax (docs/dp-scaling.md) [default: recorded, the fit chosen on "
                                 "NVIDIA's DGX Cloud FP8 weak-scaling series].")
Fp8RecipeOption = typer.Option(None, "--fp8-recipe", help="How your FP8 run scales its tensors: delayed (an amax "
                               "history all-reduced over the replicas: Megatron-Core's and NeMo's default), current "
                               "(Transformer Engine's current scaling, torchao's tensorwise), mx (MXFP8) or blockwise; "
                               "only delayed meets the other replicas, so only it takes --fp8-amax-sync's wait "
                               "[default: the --stack's recipe; Megatron-Core's delayed].")
DpOverlapWindowOption = typer.Option(None, "--dp-overlap-window", help="What an interleaved pipeline's "
                                     "data-parallel reduction hides behind: micro-batch (one micro-batch's backward "
                                     "of the stage) or chunks (each model chunk behind the chunks after it; "
                                     "docs/dp-scaling.md) [default: chunks].")
