"""The one command that starts the job from what `launch` wrote, and what a start command needs of the job folder.

The files `launch` writes name no path of the machine that ran it: a framework's training command names the job
folder's own files relative to that folder (`deepspeed/ds_config.json`), and torchtitan's needs the folder's
`torchtitan/` on PYTHONPATH to import the config module. Whoever starts the command puts the folder in front: the
printed start line with the folder as --out gave it, job.sbatch with the folder it finds itself in at run time
(`$GPUFLEET_JOB_DIR`, emit/slurm.py), so the folder may be copied anywhere.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from pathlib import Path

from gpufleet.emit.deepspeed import CONFIG_FILE as DEEPSPEED_CONFIG
from gpufleet.emit.registry import FRAMEWORKS, emitter
from gpufleet.emit.spec import EmittedFile, LaunchSpec
from gpufleet.emit.torchtitan import FOLDER as TORCHTITAN_FOLDER
from gpufleet.emit.torchtitan import MODULE as TORCHTITAN_MODULE

#: torchrun's rendezvous port on the first host (judgement: torchrun's documented default, 29500)
RENDEZVOUS_PORT = 29500
#: files of the job folder that a framework's training command names, as paths relative to the folder
JOB_FILES = frozenset({DEEPSPEED_CONFIG})


def names_job_file(word: str) -> bool:
    """Whether `word` of a training command is one of the job folder's files (relative to the folder)."""
    return word in JOB_FILES


def python_path_folders(command: Sequence[str]) -> tuple[str, ...]:
    """Folders of the job folder that `command` needs on PYTHONPATH, relative to the folder: torchtitan's trainer
    (`-m torchtitan.train --module gpufleet_torchtitan`) imports the written config module from `torchtitan/`."""
    words = list(command)
    if "torchtitan.train" in words and TORCHTITAN_MODULE in words:
        return (TORCHTITAN_FOLDER,)
    return ()


def in_folder(command: Sequence[str], folder: Callable[[str], str]) -> list[str]:
    """`command` with each job-folder file put under the folder, rendered by `folder(relative path)` (shell text)."""
    return [folder(word) if names_job_file(word) else shlex.quote(word) for word in command]


def start_command(by_target: dict[str, list[EmittedFile]], out_dir: Path, spec: LaunchSpec) -> str | None:
    """`sbatch …` when a Slurm script was written, else `kubectl apply …` for a manifest, else the torchrun line of
    the first framework written (run on every node; the job folder named as `out_dir`, the way --out gave it); None
    when nothing written starts a job (NCCL env only)."""
    for target, suffixes, verb in (("slurm", (".sbatch", ".sh"), "sbatch"), ("k8s", (".yaml", ".yml"),
                                                                            "kubectl apply -f")):
        for item in by_target.get(target, []):
            if item.path.endswith(suffixes):
                return f"{verb} {shlex.quote(str(out_dir / item.path))}"
    for target in FRAMEWORKS:
        if target in by_target:
            entry = getattr(emitter(target), "entrypoint", None)
            words = entry(spec, str(out_dir)) if callable(entry) else ()
            program = " ".join(in_folder(words, lambda path: shlex.quote(str(out_dir / path))))
            environment = getattr(emitter(target), "environment", None)
            variables = environment(spec) if callable(environment) else {}
            prefix = "".join(f"{name}={shlex.quote(value)} " for name, value in variables.items())
            paths = [shlex.quote(str(out_dir / folder)) for folder in python_path_folders(words)]
            if paths:
                prefix += f"PYTHONPATH={':'.join(paths)}${{PYTHONPATH:+:$PYTHONPATH}} "
            return (f"{prefix}torchrun --nnodes={spec.nodes} --nproc-per-node={spec.gpus_per_node} --rdzv-backend=c10d "
                    f"--rdzv-endpoint=$MASTER_ADDR:{RENDEZVOUS_PORT} {program}").rstrip()
    return None
