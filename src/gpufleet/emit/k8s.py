"""Kubernetes launch file: a Kubeflow PyTorchJob gang-scheduled by Volcano through an explicit PodGroup.

`k8s.yaml` holds two documents. The Volcano `PodGroup` asks for all of the job's pods at once
(`minMember` = hosts, `minResources` = every GPU), so a half-started job never holds GPUs while it waits. The
`PyTorchJob` (one Master and hosts - 1 Workers, one pod per host) puts each pod in that group (annotation
`scheduling.k8s.io/group-name`, `schedulerName: volcano`) and runs `torchrun` with one worker per GPU; the
training-operator passes torchrun its rendezvous through the `PET_*` environment (`nprocPerNode`). Run the
operator without its own gang scheduling (`--gang-scheduler-name` unset), or it makes a second PodGroup.

The pods carry the NCCL/torch environment of `nccl.env` (socket interface `eth0`, the pod network's), a memory
`/dev/shm` (NCCL's shared-memory transport needs more than the container default) and a termination grace period
long enough to save a checkpoint on SIGTERM.
"""

from __future__ import annotations

from typing import Any

import yaml

from gpufleet.emit.hosts import host_shape
from gpufleet.emit.megatron import command_environment
from gpufleet.emit.nccl_env import environment
from gpufleet.emit.slurm import signal_lead_s
from gpufleet.emit.spec import EmittedFile, LaunchSpec

#: The container image (judgement: NVIDIA's NGC PyTorch container, which ships torch, NCCL and torchrun; replace
#: it with the image that holds your training code).
DEFAULT_IMAGE = "nvcr.io/nvidia/pytorch:24.12-py3"
#: The pod network's interface inside a pod (judgement: eth0 with the usual CNIs; Multus secondary networks differ).
POD_SOCKET_IFNAME = "=eth0"
#: Extended resource the NVIDIA device plugin advertises GPUs as (NVIDIA k8s-device-plugin README).
GPU_RESOURCE = "nvidia.com/gpu"
#: The container name the Kubeflow training-operator looks for in a PyTorchJob replica.
CONTAINER_NAME = "pytorch"
#: What torchrun starts when the spec names no training command (edit it, or give LaunchSpec.train_command).
DEFAULT_TRAIN_SCRIPT = "train.py"


def _pod_template(spec: LaunchSpec, gpus_per_pod: int) -> dict[str, Any]:
    env = [{"name": v.name, "value": v.value} for v in environment(spec, POD_SOCKET_IFNAME)]
    env += [{"name": name, "value": value} for name, value in command_environment(spec).items()]
    env.append({"name": "CHECKPOINT_DIR", "value": spec.checkpoint_dir})
    command = ["torchrun", *(spec.train_command or (DEFAULT_TRAIN_SCRIPT,))]
    container = {
        "name": CONTAINER_NAME,
        "image": DEFAULT_IMAGE,
        "command": command,
        "env": env,
        "resources": {"limits": {GPU_RESOURCE: gpus_per_pod}, "requests": {GPU_RESOURCE: gpus_per_pod}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    return {
        "metadata": {"annotations": {"scheduling.k8s.io/group-name": spec.job_name}},
        "spec": {
            "schedulerName": "volcano",
            "terminationGracePeriodSeconds": signal_lead_s(spec),
            "containers": [container],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        },
    }


def manifests(spec: LaunchSpec) -> list[dict[str, Any]]:
    """The PodGroup and the PyTorchJob, as plain data."""
    shape = host_shape(spec.cluster, "k8s")
    podgroup = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": spec.job_name},
        "spec": {"minMember": shape.hosts, "minResources": {GPU_RESOURCE: str(shape.hosts * shape.gpus_per_host)}},
    }
    template = _pod_template(spec, shape.gpus_per_host)
    replicas: dict[str, Any] = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}}
    if shape.hosts > 1:
        replicas["Worker"] = {"replicas": shape.hosts - 1, "restartPolicy": "OnFailure", "template": template}
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": spec.job_name},
        "spec": {"nprocPerNode": str(shape.gpus_per_host), "pytorchReplicaSpecs": replicas},
    }
    return [podgroup, job]


def manifest_text(spec: LaunchSpec) -> str:
    cluster = spec.cluster
    shape = host_shape(cluster, "k8s")
    header = (f"# {spec.job_name}: {spec.job.model.id} on {cluster.gpus} x {cluster.gpu.id} as {shape.hosts} pods of "
              f"{shape.gpus_per_host} GPUs, plan {spec.rank}: {spec.layout.short()}\n"
              "# Volcano gang-schedules the pods (PodGroup minMember = pods); apply with: kubectl apply -f k8s.yaml\n")
    return header + yaml.safe_dump_all(manifests(spec), sort_keys=False)


class K8sEmitter:
    name = "k8s"

    def render(self, spec: LaunchSpec) -> list[EmittedFile]:
        return [EmittedFile("k8s.yaml", manifest_text(spec))]


emitter = K8sEmitter()
