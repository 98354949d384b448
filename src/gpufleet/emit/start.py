"""The one command that starts the job from what `launch` wrote."""

from __future__ import annotations

import shlex
from pathlib import Path

from gpufleet.emit.registry import FRAMEWORKS, emitter
from gpufleet.emit.spec import EmittedFile, LaunchSpec

#: torchrun's rendezvous port on the first host (judgement: torchrun's documented default, 29500)
RENDEZVOUS_PORT = 29500


def start_command(by_target: dict[str, list[EmittedFile]], out_dir: Path, spec: LaunchSpec) -> str | None:
    """`sbatch …` when a Slurm script was written, else `kubectl apply …` for a manifest, else the torchrun line of
    the first framework written (run on every node); None when nothing written starts a job (NCCL env only)."""
    for target, suffixes, verb in (("slurm", (".sbatch", ".sh"), "sbatch"), ("k8s", (".yaml", ".yml"),
                                                                            "kubectl apply -f")):
        for item in by_target.get(target, []):
            if item.path.endswith(suffixes):
                return f"{verb} {shlex.quote(str(out_dir / item.path))}"
    for target in FRAMEWORKS:
        if target in by_target:
            entry = getattr(emitter(target), "entrypoint", None)
            words = entry(spec, str(out_dir)) if callable(entry) else ()
            program = " ".join(shlex.quote(word) for word in words)
            environment = getattr(emitter(target), "environment", None)
            variables = environment(spec) if callable(environment) else {}
            prefix = "".join(f"{name}={shlex.quote(value)} " for name, value in variables.items())
            return (f"{prefix}torchrun --nnodes={spec.nodes} --nproc-per-node={spec.gpus_per_node} --rdzv-backend=c10d "
                    f"--rdzv-endpoint=$MASTER_ADDR:{RENDEZVOUS_PORT} {program}").rstrip()
    return None
