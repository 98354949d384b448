"""Slurm launch files: topology from the fabric's bill of materials, the sbatch script, and a real Slurm running them.

The real-Slurm tests start munged, slurmctld and one slurmd per host on 127.0.0.1 (tests/slurm_cluster.py): the
emitted topology.conf is what slurmctld loads, an emitted sbatch runs a 2-host x 2-worker torchrun/gloo job to
completion, GPU-shaped scripts pass `sbatch --test-only`, and the save-then-requeue cycle runs on a real signal.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from emit_specs import small_catalog, spec_from_plan
from gpufleet.emit import slurm
from gpufleet.emit.hosts import hostlist
from gpufleet.emit.spec import LaunchSpec, TargetCannotExpress
from gpufleet.errors import InputError
from gpufleet.fabric.bom import bill_of_materials
from gpufleet.fabric.graph import build_graph
from gpufleet.fabric.topology import Cluster, Fabric
from gpufleet.planner.plan import PlanRequest
from slurm_cluster import Host, SlurmCluster, missing_binaries

VENV_BIN = str(Path(sys.executable).parent)


@pytest.fixture(scope="module")
def h100_64() -> LaunchSpec:
    return spec_from_plan(PlanRequest(model="llama3-8b", gpus=64, top=1))


@pytest.fixture(scope="module")
def nvl72_144() -> LaunchSpec:
    return spec_from_plan(PlanRequest(model="llama3-70b", gpu="gb200", gpus=144, top=1))


def _cluster(spec: LaunchSpec, gpus: int, **fabric: object) -> LaunchSpec:
    """`spec` on another cluster of the same node (topology reads only the cluster)."""
    network = spec.cluster.fabric.network
    return replace(spec, cluster=Cluster(spec.cluster.gpu, spec.cluster.node, gpus, Fabric(network, **fabric)))


def _lines(conf: str) -> dict[str, str]:
    """topology.conf as switch name -> its children clause."""
    found = {}
    for line in conf.splitlines():
        match = re.match(r"SwitchName=(\S+) (\S+)", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


# --- topology, by hand and against the bill of materials ----------------------------------------------------------

def test_hostlist_compresses_runs() -> None:
    assert hostlist("node", [3, 1, 2, 7, 9, 10]) == "node[1-3,7,9-10]"
    assert hostlist("node", [5]) == "node5"


def test_64_h100_topology_by_hand(h100_64: LaunchSpec) -> None:
    # NDR radix 64 at 1:1: 32 node ports per leaf / 8 NICs = 4 hosts per leaf -> 2 leaves; 2 x 32 uplinks fill
    # one 64-port spine.
    assert _lines(slurm.topology_conf(h100_64)) == {
        "leaf0": "Nodes=node[1-4]", "leaf1": "Nodes=node[5-8]", "spine0": "Switches=leaf[0-1]"}
    assert slurm.leaf_switches_spanned(h100_64) == 2
    assert "#SBATCH --switches=2@00:05:00" in slurm.sbatch_script(h100_64)


@pytest.mark.parametrize("gpus,fabric", [
    (1024, {"oversubscription": 1.0}),  # 128 nodes: 32 leaves, 16 spines (two tiers)
    (4096, {"oversubscription": 1.0}),  # 512 nodes: 128 leaves > radix: three tiers with cores
    (1024, {"kind": "leaf-spine", "oversubscription": 3.0}),
    (2048, {"kind": "dragonfly+", "oversubscription": 1.0}),
])
def test_switches_are_the_bill_of_materials(h100_64: LaunchSpec, gpus: int, fabric: dict[str, object]) -> None:
    spec = _cluster(h100_64, gpus, **fabric)
    switches = slurm.topology(spec)
    bom = {tier.tier: tier.switches for tier in bill_of_materials(build_graph(spec.cluster), spec.cluster).tiers}
    named = {kind: sum(1 for s in switches if s.name.startswith(kind)) for kind in ("leaf", "spine", "core")}
    assert {k: v for k, v in named.items() if v} == bom
    hosts = [h for s in switches if s.level == 0 for h in s.hosts]
    assert sorted(hosts) == list(range(1, spec.cluster.num_nodes + 1))  # every host under exactly one leaf
    defined = {s.name for s in switches}
    assert all(child in defined for s in switches for child in s.switches)
    if fabric.get("kind") == "dragonfly+":  # groups joined by one logical top switch
        assert [s.name for s in switches if s.level == max(x.level for x in switches)] == ["dragonfly"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(nodes=st.integers(1, 160), kind=st.sampled_from(["fat-tree", "leaf-spine", "rail-optimized", "dragonfly+"]),
       oversubscription=st.sampled_from([1.0, 2.0, 3.0]))
def test_topology_is_a_tree_slurm_accepts(h100_64: LaunchSpec, nodes: int, kind: str,
                                          oversubscription: float) -> None:
    try:
        spec = _cluster(h100_64, nodes * 8, kind=kind, oversubscription=oversubscription)
        switches = slurm.topology(spec)
    except InputError:  # a fabric the switch radix cannot build: nothing to emit
        assume(False)
        return
    hosts = sorted(h for s in switches if s.level == 0 for h in s.hosts)
    assert hosts == list(range(1, nodes + 1))  # each host under exactly one lowest-tier switch
    by_name = {s.name: s for s in switches}
    assert len(by_name) == len(switches)
    for switch in switches:
        assert bool(switch.hosts) == (switch.level == 0)
        assert all(by_name[child].level < switch.level for child in switch.switches)
    covered: dict[str, set[int]] = {}
    for switch in sorted(switches, key=lambda s: s.level):
        covered[switch.name] = set(switch.hosts).union(*(covered[c] for c in switch.switches))
    assert any(covered[s.name] == set(hosts) for s in switches)  # one switch reaches every host: connected


def test_rack_shares_that_split_a_compute_tray_are_refused(nvl72_144: LaunchSpec) -> None:
    # 142 GB200 GPUs spread as 2 racks of 71: not whole 4-GPU trays
    cluster = nvl72_144.cluster
    spec = replace(nvl72_144, cluster=Cluster(cluster.gpu, cluster.node, 142, cluster.fabric))
    with pytest.raises(TargetCannotExpress, match="71 GPUs per gb200-nvl72 rack"):
        slurm.emitter.render(spec)


def test_rail_optimized_groups_scalable_units(h100_64: LaunchSpec) -> None:
    spec = _cluster(h100_64, 512, kind="rail-optimized")
    # radix 64 at 1:1: a rail leaf takes 32 hosts (one NIC each): 64 hosts = 2 scalable units of 32
    lines = _lines(slurm.topology_conf(spec))
    assert lines["su0"] == "Nodes=node[1-32]" and lines["su1"] == "Nodes=node[33-64]"
    assert slurm.leaf_switches_spanned(spec) == 2


def test_nvl72_racks_are_the_lowest_tier_and_blocks(nvl72_144: LaunchSpec) -> None:
    files = {f.path: f.text for f in slurm.emitter.render(nvl72_144)}
    # 2 racks of 72 GPUs = 36 compute trays of 4 GPUs; each rack's 72 NICs fill 32-port leaves: 0-1 and part of 2
    assert "#SBATCH --nodes=36" in files["job.sbatch"] and "#SBATCH --gpus-per-node=4" in files["job.sbatch"]
    lines = _lines(files["topology.conf"])
    assert lines["rack0"] == "Nodes=node[1-18]" and lines["rack1"] == "Nodes=node[19-36]"
    assert lines["leaf0"] == "Switches=rack0" and lines["leaf2"] == "Switches=rack[0-1]"
    block = files["topology-block.conf"]
    assert "BlockName=rack0 Nodes=node[1-18]" in block and "BlockName=rack1 Nodes=node[19-36]" in block
    assert "BlockSizes=18" in block


def test_signal_lead_and_time_limit(h100_64: LaunchSpec) -> None:
    spec = replace(h100_64, checkpoint_write_s=100.0, train_iters=10)
    assert slurm.signal_lead_s(spec) == 120 + 2 * 100
    # 10 steps of ~6.6 s: less than the floor of lead + 10 minutes of work (920 s), rounded up to whole minutes
    assert h100_64.step.step_s * 10 * 1.1 + 320 < 920
    assert slurm.time_limit_s(spec) == 960
    assert slurm.slurm_duration(90061) == "1-01:01:01"
    script = slurm.sbatch_script(spec)
    assert "#SBATCH --signal=B:USR1@320" in script and "#SBATCH --time=00:16:00" in script
    assert slurm.signal_lead_s(replace(spec, checkpoint_write_s=None)) == slurm.DEFAULT_SIGNAL_LEAD_S


def test_sbatch_is_valid_bash(h100_64: LaunchSpec) -> None:
    subprocess.run(["bash", "-n"], input=slurm.sbatch_script(h100_64), text=True, check=True)


def test_sbatch_exports_what_the_megatron_target_writes_to_megatron_env(tmp_path: Path) -> None:
    """A tp>1 ZeRO-1 Megatron plan: the megatron target writes megatron.env with CUDA_DEVICE_MAX_CONNECTIONS=1 and
    job.sbatch, starting that target's pretrain_gpt.py, exports the same before srun; a ZeRO-3 (Megatron FSDP) plan,
    or another training command, gets no such line (Megatron FSDP refuses the variable)."""
    from gpufleet.emit.megatron import ENV_FILE, MEGATRON
    from gpufleet.planner.search import SearchSpace

    zero1 = spec_from_plan(PlanRequest(model="llama3-70b", gpus=64, top=1, stack="megatron-lm",
                                       search_space=SearchSpace(shardings=("zero1",))))
    assert zero1.layout.tp > 1 and zero1.layout.sharding == "zero1"
    env_file = {f.path: f.text for f in MEGATRON.render(zero1)}[ENV_FILE]
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in env_file.splitlines()
    megatron = replace(zero1, train_command=MEGATRON.entrypoint(zero1, str(tmp_path)))
    script = slurm.sbatch_script(megatron)
    exports = [line for line in script.splitlines() if "CUDA_DEVICE_MAX_CONNECTIONS" in line]
    assert len(exports) == 1 and exports[0].startswith("export CUDA_DEVICE_MAX_CONNECTIONS=1  # ")
    assert script.index(exports[0]) < script.index("\nsrun ")
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    # the variable reaches the training command: run the script's export lines and read the environment back
    shown = subprocess.run(["bash", "-c", "\n".join([*(line for line in script.splitlines()
                                                       if line.startswith("export CUDA_")),
                                                     'echo "$CUDA_DEVICE_MAX_CONNECTIONS"'])],
                           capture_output=True, text=True, check=True)
    assert shown.stdout == "1\n"

    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in slurm.sbatch_script(replace(zero1, train_command=("train.py",)))
    fsdp = replace(zero1, layout=replace(zero1.layout, sharding="zero3"))
    assert ENV_FILE not in {f.path for f in MEGATRON.render(fsdp)}
    fsdp = replace(fsdp, train_command=MEGATRON.entrypoint(fsdp, str(tmp_path)))
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in slurm.sbatch_script(fsdp)


# --- a real Slurm -------------------------------------------------------------------------------------------------

requires_slurm = pytest.mark.skipif(bool(missing_binaries()),
                                    reason=f"Slurm/munge binaries missing: {', '.join(missing_binaries())} "
                                    "(apt-get install slurm-wlm munge; .ci/run does)")


@pytest.fixture(scope="module")
def slurm64(tmp_path_factory: pytest.TempPathFactory, h100_64: LaunchSpec) -> Iterator[SlurmCluster]:
    """8 hosts of 8 fake GPUs under the topology.conf emitted for the 64-GPU plan."""
    root = tmp_path_factory.mktemp("slurm64")
    cluster = SlurmCluster(root, [Host(f"node{k}", cpus=4, gpus=8) for k in range(1, 9)],
                           topology_conf=slurm.topology_conf(h100_64))
    try:
        cluster.start()
        print(f"slurm with 8 hosts started in {cluster.started_s:.2f} s")
        yield cluster
    finally:
        cluster.stop()


@requires_slurm
@pytest.mark.timeout(120)
def test_slurmctld_loads_the_emitted_topology(slurm64: SlurmCluster) -> None:
    shown = slurm64.run("scontrol", "show", "topology")
    rows = {m.group(1): m.group(2) for m in re.finditer(r"SwitchName=(\S+) Level=(\d)", shown)}
    assert rows == {"leaf0": "0", "leaf1": "0", "spine0": "1"}
    assert re.search(r"SwitchName=leaf0 .*Nodes=node\[1-4\]", shown)
    assert re.search(r"SwitchName=spine0 .*Switches=leaf\[0-1\]", shown)


@requires_slurm
@pytest.mark.timeout(120)
def test_gpu_shaped_sbatch_passes_test_only(slurm64: SlurmCluster, h100_64: LaunchSpec, nvl72_144: LaunchSpec,
                                            tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(slurm.sbatch_script(h100_64))
    out = slurm64.run("sbatch", "--test-only", str(script), "train.py", cwd=tmp_path)
    assert "to start at" in out and "nodes node[1-8]" in out
    # the NVL72 job asks for 36 hosts: this 8-host Slurm must refuse it (test-only really checks)
    script.write_text(slurm.sbatch_script(nvl72_144))
    refused = slurm64.run("sbatch", "--test-only", str(script), "train.py", cwd=tmp_path, check=False)
    assert "to start at" not in refused and "Requested node configuration is not available" in refused


ALLREDUCE = """\
import os
import pathlib
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
# one file per rank: four processes printing to the one Slurm output file can interleave their lines
pathlib.Path(__file__).with_name(f"rank-{rank}.txt").write_text(
    f"rank={rank} world={world} node={os.environ['GROUP_RANK']} slurm_node={os.environ['SLURM_NODEID']} "
    f"local={os.environ['LOCAL_RANK']} sum={value.item():g}")
dist.destroy_process_group()
"""


def _small_spec(tmp_path: Path, script: Path, checkpoint_dir: Path) -> LaunchSpec:
    request = PlanRequest(model="llama3-8b", gpus=4, node="test-2gpu", top=1, tokens=1e9)
    return spec_from_plan(request, small_catalog(tmp_path), train_command=(str(script),),
                          checkpoint_dir=str(checkpoint_dir))


def _submit(cluster: SlurmCluster, spec: LaunchSpec, folder: Path, port: int) -> str:
    script = folder / "job.sbatch"
    script.write_text(slurm.sbatch_script(spec))
    env = {**cluster.env(VENV_BIN), "MASTER_PORT": str(port)}
    result = subprocess.run(["sbatch", "--parsable", str(script)], env=env, cwd=folder, capture_output=True,
                            text=True, timeout=60, check=True)
    return result.stdout.strip().split(";")[0]


@requires_slurm
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_emitted_sbatch_runs_a_torchrun_gloo_job(slurm64: SlurmCluster, tmp_path: Path) -> None:
    from slurm_cluster import free_ports

    train = tmp_path / "allreduce.py"
    train.write_text(ALLREDUCE)
    spec = _small_spec(tmp_path, train, tmp_path / "ckpt")
    assert (spec.nodes, spec.gpus_per_node) == (2, 2)
    job = _submit(slurm64, spec, tmp_path, free_ports(1)[0])
    state = slurm64.wait_state(job, {"COMPLETED"}, timeout_s=240)
    output = (tmp_path / f"gpufleet-{job}.out").read_text()
    assert state == "COMPLETED", output + slurm64.logs()
    rows = [dict(kv.split("=") for kv in path.read_text().split()) for path in sorted(tmp_path.glob("rank-*.txt"))]
    assert sorted(int(r["rank"]) for r in rows) == [0, 1, 2, 3]
    assert all(r["world"] == "4" and r["sum"] == "10" for r in rows)  # 1 + 2 + 3 + 4
    # block order: rank = node rank x 2 + local rank, node rank = Slurm's host order
    assert all(int(r["rank"]) == int(r["node"]) * 2 + int(r["local"]) and r["node"] == r["slurm_node"]
               for r in rows)


SAVE_ON_SIGNAL = """\
import os
import pathlib
import signal
import sys
import time

import torch.distributed as dist

asked = []
signal.signal(signal.SIGUSR1, lambda *_: asked.append(True))
dist.init_process_group("gloo")
rank = dist.get_rank()
folder = pathlib.Path(os.environ["CHECKPOINT_DIR"])
if (folder / f"saved{rank}").exists():
    sys.exit(0)  # a requeued run: resumed and finished
(folder / f"ready{rank}").touch()
while not asked:
    time.sleep(0.1)
(folder / f"saved{rank}").touch()  # the "checkpoint"
sys.exit(0)
"""


def _wait_for_files(slurm: SlurmCluster, job: str, folder: Path, pattern: str, count: int, deadline: float) -> None:
    """Until the job's workers have written `count` files matching `pattern` in `folder`, while it is still queued or
    running; its Slurm logs if it ends first or the deadline passes."""
    while len(list(folder.glob(pattern))) < count:
        assert time.monotonic() < deadline, slurm.logs()
        assert slurm.job_field(job, "JobState") in ("PENDING", "RUNNING"), slurm.logs()
        time.sleep(0.3)


@requires_slurm
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_time_limit_signal_saves_then_requeues(slurm64: SlurmCluster, tmp_path: Path) -> None:
    from slurm_cluster import free_ports

    train = tmp_path / "save_on_signal.py"
    train.write_text(SAVE_ON_SIGNAL)
    checkpoints = tmp_path / "ckpt"
    checkpoints.mkdir()
    job = _submit(slurm64, _small_spec(tmp_path, train, checkpoints), tmp_path, free_ports(1)[0])
    deadline = time.monotonic() + 240
    _wait_for_files(slurm64, job, checkpoints, "ready*", 4, deadline)
    # what --signal=B:USR1@lead does at the time limit: signal the batch shell only
    slurm64.run("scancel", "--batch", "--signal=USR1", job)
    while int(slurm64.job_field(job, "Restarts") or 0) < 1:
        assert time.monotonic() < deadline, slurm64.logs()
        time.sleep(0.3)
    assert sorted(p.name for p in checkpoints.glob("saved*")) == ["saved0", "saved1", "saved2", "saved3"]
    slurm64.run("scancel", job)


NO_HANDLER = """\
import os
import pathlib
import signal
import time

import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
# what the worker starts with: torchrun's, which it inherits from the script's srun line
pathlib.Path(os.environ["CHECKPOINT_DIR"], f"usr1-{rank}").write_text(signal.getsignal(signal.SIGUSR1).name)
time.sleep(600)  # a trainer with no handler (torchtitan 0.3.0): SIGUSR1 at its default ends it here
"""


@requires_slurm
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_time_limit_signal_reaches_a_trainer_without_a_handler(slurm64: SlurmCluster, tmp_path: Path) -> None:
    """Every worker starts with SIGUSR1 at its default (SIG_DFL), not ignored, and torchrun outlives the signal: a
    trainer that installs no handler ends at the time-limit signal and the job is requeued at once (it resumes from
    its last periodic checkpoint). Under the earlier `trap "" USR1; exec torchrun` every worker started with SIG_IGN:
    such a trainer ignored the signal and ran into the time limit, and the job was never requeued."""
    from slurm_cluster import free_ports

    train = tmp_path / "no_handler.py"
    train.write_text(NO_HANDLER)
    checkpoints = tmp_path / "ckpt"
    checkpoints.mkdir()
    job = _submit(slurm64, _small_spec(tmp_path, train, checkpoints), tmp_path, free_ports(1)[0])
    deadline = time.monotonic() + 240
    _wait_for_files(slurm64, job, checkpoints, "usr1-*", 4, deadline)
    assert {p.read_text() for p in checkpoints.glob("usr1-*")} == {"SIG_DFL"}
    slurm64.run("scancel", "--batch", f"--signal={slurm.TIME_LIMIT_SIGNAL}", job)
    signalled = time.monotonic()
    while int(slurm64.job_field(job, "Restarts") or 0) < 1:
        assert time.monotonic() - signalled < 60, (tmp_path / f"gpufleet-{job}.out").read_text()[-3000:]
        time.sleep(0.3)
    output = (tmp_path / f"gpufleet-{job}.out").read_text()
    slurm64.run("scancel", job)
    # torchrun lived to report its workers' end by the signal (had USR1 ended torchrun itself, srun would have
    # reported the task killed instead)
    assert "Signal 10 (SIGUSR1) received by PID" in output, output[-3000:]
    exited = re.search(r"the trainer exited \((\d+)\): requeueing", output)
    assert exited and exited.group(1) != "0", output[-3000:]  # srun's status: its tasks failed


@pytest.fixture(scope="module")
def slurm_nvl72(tmp_path_factory: pytest.TempPathFactory, nvl72_144: LaunchSpec) -> Iterator[SlurmCluster]:
    """36 compute trays of 4 fake GPUs (2 NVL72 racks) under the emitted rack/leaf/spine tree."""
    root = tmp_path_factory.mktemp("slurm_nvl72")
    cluster = SlurmCluster(root, [Host(f"node{k}", cpus=2, gpus=4) for k in range(1, 37)],
                           topology_conf=slurm.topology_conf(nvl72_144))
    try:
        cluster.start()
        print(f"slurm with 36 hosts started in {cluster.started_s:.2f} s")
        yield cluster
    finally:
        cluster.stop()


@requires_slurm
@pytest.mark.timeout(180)
def test_nvl72_tree_loads_and_its_job_fits(slurm_nvl72: SlurmCluster, nvl72_144: LaunchSpec,
                                           tmp_path: Path) -> None:
    shown = slurm_nvl72.run("scontrol", "show", "topology")
    levels = {m.group(1): int(m.group(2)) for m in re.finditer(r"SwitchName=(\S+) Level=(\d)", shown)}
    assert levels["rack0"] == levels["rack1"] == 0 and levels["leaf0"] == 1 and levels["spine0"] == 2
    script = tmp_path / "job.sbatch"
    script.write_text(slurm.sbatch_script(nvl72_144))
    out = slurm_nvl72.run("sbatch", "--test-only", str(script), "train.py", cwd=tmp_path)
    assert "to start at" in out and "nodes node[1-36]" in out
