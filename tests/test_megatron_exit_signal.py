"""Megatron-LM's own parser on the exit-signal arguments `launch --target megatron` writes: the argument list asks
Megatron to save and exit on SIGUSR1, the signal job.sbatch passes on before the time limit, and Megatron's
parse_args()/validate_args() read it as its signal handler on that signal (TrainingConfig.exit_signal_handler and
exit_signal, whose default is SIGTERM), and its DistributedSignalHandler is built on it.

Megatron-LM's parser is not on PyPI: this runs where MEGATRON_LM_DIR points at a checkout (tests/test_megatron_lm.py
has the same rule; docs/launch.md names the tags it ran at).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from emit_specs import spec_from_plan
from gpufleet.emit import slurm
from gpufleet.emit.megatron import EXIT_SIGNAL, megatron_args, megatron_environment
from gpufleet.planner.plan import PlanRequest

CHECKOUT = os.environ.get("MEGATRON_LM_DIR")
pytestmark = [pytest.mark.framework, pytest.mark.timeout(600),
              pytest.mark.skipif(not CHECKOUT, reason="MEGATRON_LM_DIR is not set: point it at a Megatron-LM "
                                 "checkout (its megatron/training/arguments.py is not on PyPI) to run this")]

#: parse_args + validate_args in a subprocess (the harness's stubs: an H100's CUDA capability on this CPU torch),
#: then Megatron's own signal handler class built on the parsed signal, as global_vars._set_signal_handler does
READ = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[2])
from megatron_lm_harness import _stub
_stub()
plan = json.load(sys.stdin)
os.environ.update(WORLD_SIZE=str(plan["world_size"]), RANK="0", LOCAL_RANK="0", **plan["env"])
sys.argv = ["pretrain_gpt.py", *plan["argv"]]
from megatron.training.arguments import parse_args, validate_args
from megatron.training.dist_signal_handler import DistributedSignalHandler
import contextlib, io
with contextlib.redirect_stdout(io.StringIO()):
    args = parse_args()
    validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
handler = DistributedSignalHandler(args.exit_signal).__enter__()
import signal
installed = signal.getsignal(args.exit_signal) is not signal.SIG_DFL
handler.release()
print(json.dumps({"exit_signal_handler": args.exit_signal_handler, "exit_signal": args.exit_signal.name,
                  "installed": installed}))
"""


def test_megatron_reads_the_exit_signal_the_slurm_job_sends() -> None:
    assert CHECKOUT
    spec = spec_from_plan(PlanRequest(model="llama3-8b", gpus=64, top=1))
    argv = megatron_args(spec)
    assert argv[-2:] == ["--exit-signal-handler", f"--exit-signal={EXIT_SIGNAL}"]
    assert f"SIG{slurm.TIME_LIMIT_SIGNAL}" == EXIT_SIGNAL and f"--signal=B:{slurm.TIME_LIMIT_SIGNAL}@" in (
        slurm.sbatch_script(spec))
    plan = {"argv": argv, "world_size": spec.layout.gpus, "env": megatron_environment(spec)}
    done = subprocess.run([sys.executable, "-c", READ, CHECKOUT, str(Path(__file__).parent)], input=json.dumps(plan),
                          capture_output=True, text=True, timeout=500, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    read = json.loads(done.stdout.strip().splitlines()[-1])
    assert read == {"exit_signal_handler": True, "exit_signal": "SIGUSR1", "installed": True}
