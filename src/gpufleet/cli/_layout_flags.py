"""The layout flags `plan` and `launch` share: each pins or narrows one layout field of the search
(planner/pins.py parses them; the stack's layout defaults fill the fields left free)."""

from __future__ import annotations

import typer

_DEGREE = "one value (8), a list (2,4,8) or a range (1-8)"

TpOption = typer.Option(None, "--tp", metavar="N|LIST|RANGE", help=f"Tensor-parallel degree: {_DEGREE}.")
PpOption = typer.Option(None, "--pp", metavar="N|LIST|RANGE", help=f"Pipeline stages: {_DEGREE}.")
VppOption = typer.Option(None, "--vpp", metavar="N|LIST|RANGE", help=f"Virtual stages per pipeline rank "
                         f"(interleaved schedule): {_DEGREE}.")
CpOption = typer.Option(None, "--cp", metavar="N|LIST|RANGE", help=f"Context-parallel degree: {_DEGREE}.")
EpOption = typer.Option(None, "--ep", metavar="N|LIST|RANGE", help=f"Expert-parallel degree (MoE): {_DEGREE}.")
EtpOption = typer.Option(None, "--etp", metavar="N|LIST|RANGE", help=f"Tensor parallelism inside the experts "
                         f"(Megatron's --expert-tensor-parallel-size): {_DEGREE}.")
MicroBatchOption = typer.Option(None, "--micro-batch", metavar="N|LIST|RANGE", help=f"Sequences per micro-batch: "
                                f"{_DEGREE}.")
ShardingOption = typer.Option(None, "--sharding", metavar="KIND[,KIND]", help="none, zero1, zero2, zero3, fsdp or "
                              "hsdp, or a comma-separated list [default: the search's, or the --stack's documented "
                              "one].")
RecomputeOption = typer.Option(None, "--recompute", metavar="KIND[,KIND]", help="none, selective or full, or a "
                               "comma-separated list [default: the search tries each].")
