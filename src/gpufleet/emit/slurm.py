"""Slurm launch files: an sbatch script that starts the job under torchrun, and the cluster's topology.conf.

`job.sbatch` asks for whole hosts (`--exclusive`), one torchrun per host that starts a worker per GPU, the
hosts under as few leaf switches as the fabric allows (`--switches`), and a save-then-requeue cycle before the
time limit: Slurm signals the batch shell (`--signal=B:USR1@lead`), the shell passes SIGUSR1 to the training step
(srun forwards it to every process of the step), waits for the trainer to save and exit, and puts the job back in
the queue (`--requeue`, `scontrol requeue`); the next allocation resumes from that checkpoint. torchrun runs under
a Python handler for SIGUSR1 that does nothing (it waits for its workers), not under `trap "" USR1`: an ignored
signal stays ignored in every process started from it, so no worker could act on it. The workers start with
SIGUSR1 at its default: Megatron-LM installs its handler (`--exit-signal-handler --exit-signal=SIGUSR1`), as does
gpufleet's burn-in; a trainer without one (torchtitan 0.3.0) ends at once and resumes from its last periodic
checkpoint. Ranks follow Slurm's host order (torchrun's static rendezvous with `--node-rank=$SLURM_NODEID`, master
on the first host), which topology/tree keeps switch-contiguous.

The script names no path of the machine that ran `launch`: it finds the folder it was submitted from (the job's
`Command`, which Slurm records as the script's absolute path) as `$GPUFLEET_JOB_DIR`, puts that folder in front of
the job's own files in the training command (DeepSpeed's config) and its `torchtitan/` on PYTHONPATH.

`topology.conf` is the tree plugin's view of the fabric the planner built (`fabric.graph`): the lowest tier is
what a job should not straddle (a leaf switch; a rail-optimized scalable unit, whose rail leaves every host
reaches; a rack-scale NVLink domain such as an NVL72 rack), then the physical spine and core switches of the
bill of materials. A rack-scale system also gets `topology-block.conf` for the block plugin (Slurm 23.11+).
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

import numpy as np

from gpufleet.emit.deepspeed import script_duties
from gpufleet.emit.hosts import HostShape, host_shape, hostlist
from gpufleet.emit.megatron import EXIT_SIGNAL, command_environment
from gpufleet.emit.nccl_env import shell_exports
from gpufleet.emit.spec import EmittedFile, LaunchSpec
from gpufleet.emit.start import in_folder, names_job_file, python_path_folders
from gpufleet.fabric.graph import CORE, LEAF, NIC, SPINE, TIERS, FabricGraph, build_graph

#: Longest wait for the --switches count: Slurm caps it at SchedulerParameters=max_switch_wait, 300 s by default
#: (slurm.conf(5)); asking for more only helps where a site raised that cap.
SWITCH_WAIT_S = 300
#: Signal lead when the plan has no checkpoint write time (judgement: ten minutes saves most checkpoints).
DEFAULT_SIGNAL_LEAD_S = 600
#: Lead time = this margin + twice the checkpoint write time (judgement: a save slower than planned still lands).
SIGNAL_MARGIN_S = 120
#: sbatch accepts a signal lead of at most 65535 s (sbatch(1)).
MAX_SIGNAL_LEAD_S = 65535
#: Longest allocation asked for (judgement: a day is a common MaxTime; longer runs requeue themselves).
MAX_ALLOCATION_S = 24 * 3600
#: Allocation headroom over the predicted training time (judgement: start-up, saves, the plan's error).
ALLOCATION_HEADROOM = 1.10
#: Shortest allocation asked for beyond the signal lead (judgement: time to load and take a few steps).
MIN_WORK_S = 600
#: torchrun's default master port, overridable at submit time with MASTER_PORT.
DEFAULT_MASTER_PORT = 29500
#: The signal Slurm sends the batch shell before the time limit, and the shell passes on to the trainer (without
#: "SIG", as sbatch --signal and kill take it); the Megatron arguments handle the same one.
TIME_LIMIT_SIGNAL = EXIT_SIGNAL.removeprefix("SIG")
#: torchrun started from Python under a handler for the time-limit signal that does nothing: torchrun lives on and
#: waits for its workers, and the workers (new processes) start with the signal at its default, not ignored.
#: torch.distributed.run.main is what the torchrun command runs.
TORCHRUN_MAIN = (f"import signal, sys; signal.signal(signal.{EXIT_SIGNAL}, lambda *_: None); "
                 'sys.argv[0] = "torchrun"; from torch.distributed.run import main; main()')


@dataclass(frozen=True)
class Switch:
    """One topology.conf line: a switch and its children (hosts for the lowest tier, else switches)."""

    name: str
    level: int
    hosts: tuple[int, ...] = ()
    switches: tuple[str, ...] = ()
    #: what the switch is, for the comment above it
    what: str = ""


def signal_lead_s(spec: LaunchSpec) -> int:
    """Seconds before the time limit at which the job is told to save."""
    if spec.checkpoint_write_s is None:
        return DEFAULT_SIGNAL_LEAD_S
    return min(MAX_SIGNAL_LEAD_S, math.ceil(SIGNAL_MARGIN_S + 2 * spec.checkpoint_write_s))


def time_limit_s(spec: LaunchSpec) -> int:
    """The allocation asked for: the predicted training time with headroom, within [lead + MIN_WORK_S, a day]."""
    lead = signal_lead_s(spec)
    run_s = spec.train_iters * spec.step.step_s * ALLOCATION_HEADROOM + lead
    return math.ceil(max(lead + MIN_WORK_S, min(run_s, MAX_ALLOCATION_S)) / 60) * 60


def slurm_duration(seconds: int) -> str:
    """Slurm's days-hours:minutes:seconds."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


# --- topology ---------------------------------------------------------------------------------------------------

def _ordinals(graph: FabricGraph) -> dict[int, str]:
    """Switch vertex -> name (leaf3, spine0, core1)."""
    names: dict[int, str] = {}
    for kind, word in ((LEAF, "leaf"), (SPINE, "spine"), (CORE, "core")):
        for ordinal, vertex in enumerate(np.flatnonzero(graph.kind == kind)):
            names[int(vertex)] = f"{word}{ordinal}"
    return names


def _down_links(graph: FabricGraph) -> dict[int, set[int]]:
    """Switch -> the vertices one tier below it (global dragonfly+ links, between spines, left out)."""
    down = {_T_LEAF_NIC, _T_SPINE_LEAF, _T_CORE_SPINE}
    below: dict[int, set[int]] = {}
    for src, dst, tier in zip(graph.src.tolist(), graph.dst.tolist(), graph.tier.tolist(), strict=True):
        if tier in down:
            below.setdefault(src, set()).add(dst)
    return below


_T_LEAF_NIC, _T_SPINE_LEAF, _T_CORE_SPINE = (TIERS.index(t) for t in ("leaf-nic", "spine-leaf", "core-spine"))


def _bottom_groups(spec: LaunchSpec, graph: FabricGraph, shape: HostShape) -> tuple[list[Switch], dict[int, str]]:
    """The lowest tier and, per physical vertex it stands for (leaves; NICs of a rack), the group's name."""
    node_hosts = [tuple(range(n * shape.hosts_per_domain + 1, (n + 1) * shape.hosts_per_domain + 1))
                  for n in range(graph.nodes)]
    nic_leaf = [[int(graph.leaf_of_nic[v]) for v in row if v >= 0] for row in graph.node_nics.tolist()]
    stands_for: dict[int, str] = {}
    groups: dict[str, list[int]] = {}
    if shape.hosts_per_domain > 1:  # a rack-scale NVLink domain per node; its NICs lead to the leaves above it
        what = f"{spec.cluster.node.id} NVLink domain ({shape.hosts_per_domain} hosts)"
        for n in range(graph.nodes):
            groups[f"rack{n}"] = list(node_hosts[n])
            stands_for.update({int(v): f"rack{n}" for v in graph.node_nics[n] if v >= 0})
    elif spec.cluster.fabric.kind == "rail-optimized":  # one group per scalable unit: its hosts reach all its rails
        what = "rail-optimized scalable unit (every host has a NIC on each of its rail leaves)"
        for n, unit in enumerate(graph.leaf_group_of_node.tolist()):
            groups.setdefault(f"su{unit}", []).extend(node_hosts[n])
            stands_for.update({leaf: f"su{unit}" for leaf in nic_leaf[n]})
    else:  # the leaf a host's first NIC plugs into (Slurm keeps a host under one leaf)
        names = _ordinals(graph)
        what = "leaf switch"
        for n in range(graph.nodes):
            leaf = nic_leaf[n][0]
            groups.setdefault(names[leaf], []).extend(node_hosts[n])
            stands_for[leaf] = names[leaf]
        for n in range(graph.nodes):  # a node wider than a leaf: its other leaves count as its first one
            for leaf in nic_leaf[n]:
                stands_for.setdefault(leaf, names[nic_leaf[n][0]])
    bottom = [Switch(name, 0, tuple(hosts), what=what) for name, hosts in groups.items()]
    return bottom, stands_for


def topology(spec: LaunchSpec) -> list[Switch]:
    """The tree plugin's switches for `spec`'s cluster, lowest tier first."""
    graph = build_graph(spec.cluster)
    shape = host_shape(spec.cluster, "slurm")
    bottom, stands_for = _bottom_groups(spec, graph, shape)
    names = _ordinals(graph)
    below = _down_links(graph)
    level_of = {s.name: 0 for s in bottom}
    upper: list[Switch] = []
    kinds = (LEAF, SPINE, CORE)
    for kind in kinds:
        for vertex in np.flatnonzero(graph.kind == kind).tolist():
            if vertex in stands_for:
                continue
            children = sorted({stands_for.get(v, names.get(v, "")) for v in below.get(vertex, ())} - {""},
                              key=_natural)
            if not children:
                continue
            level = 1 + max(level_of[c] for c in children)
            level_of[names[vertex]] = level
            upper.append(Switch(names[vertex], level, switches=tuple(children), what=_what(kind)))
    switches = bottom + upper
    if spec.cluster.fabric.kind == "dragonfly+" and len(_tops(switches)) > 1:
        tops = _tops(switches)
        top_level = 1 + max(s.level for s in switches)
        switches.append(Switch("dragonfly", top_level, switches=tuple(s.name for s in tops),
                               what="the global links joining the dragonfly+ groups (not one switch)"))
    return switches


def _what(kind: int) -> str:
    return {LEAF: "leaf switch", SPINE: "spine switch", CORE: "core switch", NIC: "NIC"}[kind]


def _tops(switches: list[Switch]) -> list[Switch]:
    children = {c for s in switches for c in s.switches}
    return [s for s in switches if s.name not in children]


def _natural(name: str) -> tuple[str, int]:
    stem = name.rstrip("0123456789")
    return stem, int(name[len(stem):] or 0)


def leaf_switches_spanned(spec: LaunchSpec) -> int:
    """Lowest-tier switches of topology.conf the job's hosts sit under: the --switches count."""
    return sum(1 for s in topology(spec) if s.level == 0)


def topology_conf(spec: LaunchSpec) -> str:
    shape = host_shape(spec.cluster, "slurm")
    lines = [f"# topology.conf for the topology/tree plugin (TopologyPlugin=topology/tree in slurm.conf): "
             f"{shape.hosts} hosts {hostlist(spec.host_prefix, list(range(1, shape.hosts + 1)))}, "
             f"{spec.cluster.fabric.kind} of {spec.cluster.fabric.network.id}."]
    if spec.cluster.fabric.kind == "dragonfly+":
        lines.append("# Add TopologyParam=Dragonfly to slurm.conf.")
    for switch in topology(spec):
        children = (f"Nodes={hostlist(spec.host_prefix, list(switch.hosts))}" if switch.hosts
                    else f"Switches={_compress_names(list(switch.switches))}")
        lines.append(f"SwitchName={switch.name} {children}  # level {switch.level}: {switch.what}")
    return "\n".join(lines) + "\n"


def _compress_names(names: list[str]) -> str:
    """Switch names as Slurm host lists, stem by stem: ['leaf0', 'leaf1', 'rack0'] -> 'leaf[0-1],rack0'."""
    by_stem: dict[str, list[int]] = {}
    for name in names:
        stem, number = _natural(name)
        by_stem.setdefault(stem, []).append(number)
    return ",".join(hostlist(stem, numbers) for stem, numbers in by_stem.items())


def block_conf(spec: LaunchSpec) -> str:
    """Block-plugin topology (Slurm 23.11+, TopologyPlugin=topology/block): one block per NVLink domain."""
    shape = host_shape(spec.cluster, "slurm")
    lines = ["# topology.conf for the topology/block plugin (Slurm 23.11 or later; TopologyPlugin=topology/block):",
             f"# one block per {spec.cluster.node.id} NVLink domain of {shape.hosts_per_domain} hosts. Rename to "
             "topology.conf to use it instead of the tree."]
    for domain in range(shape.domains):
        first = domain * shape.hosts_per_domain + 1
        hosts = list(range(first, first + shape.hosts_per_domain))
        lines.append(f"BlockName=rack{domain} Nodes={hostlist(spec.host_prefix, hosts)}")
    lines.append(f"BlockSizes={shape.hosts_per_domain}")
    return "\n".join(lines) + "\n"


# --- sbatch -----------------------------------------------------------------------------------------------------

def _header(spec: LaunchSpec, shape: HostShape) -> list[str]:
    layout, step = spec.layout, spec.step
    lead = signal_lead_s(spec)
    switches = leaf_switches_spanned(spec)
    return [
        "#!/bin/bash",
        f"# {spec.job_name}: {spec.job.model.id} on {spec.cluster.gpus} x {spec.cluster.gpu.id} "
        f"({shape.hosts} hosts x {shape.gpus_per_host} GPUs), plan {spec.rank}: {layout.short()}",
        f"# predicted {step.step_s:.2f} s per step, MFU {step.mfu:.0%}, {spec.train_iters:,} steps; "
        f"checkpoint every {spec.checkpoint_interval_steps:,} steps",
        "# Submit: sbatch job.sbatch [TRAIN_SCRIPT ARGS...]  (arguments replace the training command below)",
        f"#SBATCH --job-name={spec.job_name}",
        f"#SBATCH --nodes={shape.hosts}",
        "#SBATCH --ntasks-per-node=1  # one torchrun per host; it starts one worker per GPU",
        f"#SBATCH --gpus-per-node={shape.gpus_per_host}",
        "#SBATCH --exclusive  # whole hosts: no other job shares their GPUs, NICs or memory bandwidth",
        f"#SBATCH --switches={switches}@{slurm_duration(SWITCH_WAIT_S)}  # at most {switches} lowest-tier "
        "switch(es) of topology.conf, waiting up to 5 min for them",
        "#SBATCH --distribution=block  # consecutive ranks on the same host, hosts in topology order",
        f"#SBATCH --time={slurm_duration(time_limit_s(spec))}",
        f"#SBATCH --signal=B:{TIME_LIMIT_SIGNAL}@{lead}  # tell the batch shell {lead} s before the time limit "
        "(Slurm may send it up to a minute earlier): save, then requeue",
        "#SBATCH --requeue  # a node failure or preemption puts the job back in the queue; it resumes from the "
        "last checkpoint",
        "#SBATCH --output=%x-%j.out",
    ]


def _train_command(spec: LaunchSpec) -> list[str]:
    if spec.train_command:
        default = " ".join(in_folder(spec.train_command, lambda path: f'"$GPUFLEET_JOB_DIR"/{shlex.quote(path)}'))
        return [f"if [ $# -gt 0 ]; then TRAIN=(\"$@\"); else TRAIN=({default}); fi"]
    return ['if [ $# -eq 0 ]; then echo "usage: sbatch job.sbatch TRAIN_SCRIPT [ARGS...]" >&2; exit 2; fi',
            'TRAIN=("$@")']


def _job_folder(spec: LaunchSpec) -> list[str]:
    """Lines that find the folder launch wrote, wherever it was copied, and put what the command needs of it in
    place. Slurm runs a copy of the script from its spool folder, so $0 is not in it; the job's Command is the path
    sbatch was given, made absolute, then the script's arguments ($*)."""
    lines = [
        "# The folder launch wrote, wherever it now is: where sbatch found this script (Slurm runs a copy of it from",
        "# its spool folder; the job's Command is the script's absolute path, then its arguments). Set",
        "# GPUFLEET_JOB_DIR at submit time to name it yourself; a script given on standard input falls back to the",
        "# folder sbatch ran in.",
        'if [ -z "${GPUFLEET_JOB_DIR:-}" ]; then',
        '  SCRIPT=$(scontrol show job "$SLURM_JOB_ID" | sed -n \'s/^ *Command=//p\' | head -n 1)',
        '  SCRIPT=${SCRIPT%" $*"}',
        '  if [ -f "$SCRIPT" ]; then GPUFLEET_JOB_DIR=$(cd "$(dirname -- "$SCRIPT")" && pwd); '
        'else GPUFLEET_JOB_DIR=$SLURM_SUBMIT_DIR; fi',
        "fi",
        "export GPUFLEET_JOB_DIR",
    ]
    for folder in python_path_folders(spec.train_command):
        lines.append(f'export PYTHONPATH="$GPUFLEET_JOB_DIR"/{shlex.quote(folder)}"${{PYTHONPATH:+:$PYTHONPATH}}"'
                     "  # the training command imports the job's module from there")
    if any(names_job_file(word) for word in spec.train_command):
        lines += [f"# DeepSpeed: {duty}." for duty in script_duties(spec)]
    return lines


def _body(spec: LaunchSpec, shape: HostShape) -> list[str]:
    signal_name = TIME_LIMIT_SIGNAL
    torchrun = ('exec "${TORCHRUN_PYTHON:-python3}" -c "$GPUFLEET_TORCHRUN" --nnodes="$SLURM_JOB_NUM_NODES" '
                f'--nproc-per-node={shape.gpus_per_host} --node-rank="$SLURM_NODEID" '
                '--master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" "$@"')
    return [
        "set -uo pipefail",
        "",
        "# NCCL and PyTorch environment (the same as nccl.env)",
        *shell_exports(spec),
        *(f"export {name}={shlex.quote(value)}  # the training command's own (megatron/megatron.env)"
          for name, value in command_environment(spec).items()),
        f"export CHECKPOINT_DIR={shlex.quote(spec.checkpoint_dir)}  # where the trainer saves and resumes",
        "",
        *_job_folder(spec),
        "",
        *_train_command(spec),
        "",
        "# rendezvous: torchrun's static rendezvous, the master on the first host; node rank = Slurm's host order",
        'HEAD_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'MASTER_ADDR=$(scontrol show node "$HEAD_HOST" | sed -n \'s/.*NodeAddr=\\([^ ]*\\).*/\\1/p\')',
        f'export MASTER_ADDR MASTER_PORT="${{MASTER_PORT:-{DEFAULT_MASTER_PORT}}}"',
        "",
        f"# Before the time limit: SIG{signal_name} to every process of the training step (srun forwards it). torchrun",
        "# runs under a Python handler that ignores it and waits (python -m torch.distributed.run is torchrun; set",
        "# TORCHRUN_PYTHON to the Python that has torch if python3 is not it), and the workers start with it at its",
        "# default, not ignored: the trainer saves a checkpoint and exits. Then the job is requeued, and the next",
        "# allocation resumes from that checkpoint.",
        f"export GPUFLEET_TORCHRUN={shlex.quote(TORCHRUN_MAIN)}",
        "on_time_limit() {",
        f'  echo "gpufleet: SIG{signal_name}, the time limit is near: asking the trainer to save" >&2',
        f'  kill -{signal_name} "$TRAIN_PID" 2>/dev/null',
        '  wait "$TRAIN_PID"',
        '  echo "gpufleet: the trainer exited ($?): requeueing job $SLURM_JOB_ID" >&2',
        '  scontrol requeue "$SLURM_JOB_ID"',
        "}",
        f"trap on_time_limit {signal_name}",
        "",
        'echo "gpufleet: job $SLURM_JOB_ID, allocation $((${SLURM_RESTART_COUNT:-0} + 1)), folder '
        '$GPUFLEET_JOB_DIR" >&2',
        'srun --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_ON_NODE" --kill-on-bad-exit=1 \\',
        f"  bash -c {shlex.quote(torchrun)} torchrun \"${{TRAIN[@]}}\" &",
        "TRAIN_PID=$!",
        'wait "$TRAIN_PID"',
        'exit "$?"',
    ]


def sbatch_script(spec: LaunchSpec) -> str:
    shape = host_shape(spec.cluster, "slurm")
    return "\n".join([*_header(spec, shape), *_body(spec, shape)]) + "\n"


class SlurmEmitter:
    name = "slurm"

    def render(self, spec: LaunchSpec) -> list[EmittedFile]:
        files = [EmittedFile("job.sbatch", sbatch_script(spec), executable=True),
                 EmittedFile("topology.conf", topology_conf(spec))]
        if host_shape(spec.cluster, "slurm").hosts_per_domain > 1:
            files.append(EmittedFile("topology-block.conf", block_conf(spec)))
        return files


emitter = SlurmEmitter()
