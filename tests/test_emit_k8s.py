"""k8s.yaml: valid against the vendored CRD schemas (tests/data/k8s), one pod per host, every GPU asked for once."""

from __future__ import annotations

import copy
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from emit_specs import spec_from_plan
from gpufleet.emit import k8s
from gpufleet.emit.spec import LaunchSpec
from gpufleet.planner.plan import PlanRequest

CRDS = Path(__file__).parent / "data" / "k8s"
DOCUMENTED = Path(__file__).parent / "data" / "nccl_torch_env_documented.txt"


def crd_schema(file: str, version: str) -> dict[str, Any]:
    """The openAPIV3Schema of `version` in a CRD file (apiextensions v1: per version; v1beta1: one for all)."""
    crd = yaml.safe_load((CRDS / file).read_text())
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version and "schema" in entry:
            return entry["schema"]["openAPIV3Schema"]
    return crd["spec"]["validation"]["openAPIV3Schema"]


PODGROUP = crd_schema("volcano-podgroups-crd.yaml", "v1beta1")
PYTORCHJOB = crd_schema("pytorch-operator-pytorchjobs-crd.yaml", "v1")


#: Kubernetes release whose core API schemas check the pod template (kubernetes-validate ships them).
KUBERNETES_VERSION = "1.31.0"


def validate(document: dict[str, Any], schema: dict[str, Any]) -> None:
    jsonschema.Draft7Validator(schema).validate(document)


def validate_pod_template(template: dict[str, Any]) -> None:
    """The template as a core/v1 PodTemplate under Kubernetes' own schema, strict: unknown fields are errors."""
    wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": template}
    kubernetes_validate.validate(wrapped, KUBERNETES_VERSION, strict=True)


@pytest.fixture(scope="module", params=[
    {"model": "llama3-8b", "gpus": 64},
    {"model": "llama3-70b", "gpu": "gb200", "gpus": 144},
    {"model": "llama3-8b", "gpus": 8},
], ids=["h100x64", "nvl72x144", "one-host"])
def spec(request: pytest.FixtureRequest) -> LaunchSpec:
    return spec_from_plan(PlanRequest(top=1, **request.param), train_command=("pretrain.py", "--steps", "10"))


def _documents(spec: LaunchSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    files = k8s.emitter.render(spec)
    assert [f.path for f in files] == ["k8s.yaml"]
    podgroup, job = yaml.safe_load_all(files[0].text)
    return podgroup, job


def test_documents_validate_against_the_crds(spec: LaunchSpec) -> None:
    podgroup, job = _documents(spec)
    assert (podgroup["apiVersion"], podgroup["kind"]) == ("scheduling.volcano.sh/v1beta1", "PodGroup")
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    validate(podgroup, PODGROUP)
    validate(job, PYTORCHJOB)
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        validate_pod_template(replica["template"])


def test_the_schemas_reject_what_they_should(spec: LaunchSpec) -> None:
    podgroup, job = _documents(spec)
    broken = copy.deepcopy(podgroup)
    broken["spec"]["minMember"] = "all"
    with pytest.raises(jsonschema.ValidationError):
        validate(broken, PODGROUP)
    broken = copy.deepcopy(podgroup)
    broken["spec"]["minResources"]["nvidia.com/gpu"] = "lots"
    with pytest.raises(jsonschema.ValidationError):
        validate(broken, PODGROUP)
    broken = copy.deepcopy(job)
    broken["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    with pytest.raises(jsonschema.ValidationError):
        validate(broken, PYTORCHJOB)
    template = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    typo = copy.deepcopy(template)
    typo["spec"]["schedularName"] = typo["spec"].pop("schedulerName")
    with pytest.raises(jsonschema.ValidationError):
        validate_pod_template(typo)
    wrong = copy.deepcopy(template)
    wrong["spec"]["terminationGracePeriodSeconds"] = "ten minutes"
    with pytest.raises(jsonschema.ValidationError):
        validate_pod_template(wrong)


def test_gang_is_every_pod_and_every_gpu(spec: LaunchSpec) -> None:
    podgroup, job = _documents(spec)
    replicas = job["spec"]["pytorchReplicaSpecs"]
    pods = sum(r["replicas"] for r in replicas.values())
    gpus_per_pod = int(job["spec"]["nprocPerNode"])
    # hosts: 8-GPU servers, or 4-GPU compute trays of an NVL72 rack
    expected_per_pod = 4 if spec.cluster.node.rack_scale else spec.cluster.gpus_per_node
    assert gpus_per_pod == expected_per_pod and pods * gpus_per_pod == spec.cluster.gpus
    assert podgroup["spec"]["minMember"] == pods
    assert podgroup["spec"]["minResources"]["nvidia.com/gpu"] == str(spec.cluster.gpus)
    assert ("Worker" in replicas) == (pods > 1)
    for replica in replicas.values():
        template = replica["template"]
        assert template["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == podgroup["metadata"]["name"]
        assert template["spec"]["schedulerName"] == "volcano"
        (container,) = template["spec"]["containers"]
        assert container["name"] == "pytorch"  # the name the training-operator looks for
        assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus_per_pod
        assert container["command"] == ["torchrun", "pretrain.py", "--steps", "10"]


def test_pods_carry_the_documented_nccl_environment(spec: LaunchSpec) -> None:
    _, job = _documents(spec)
    documented = {line.split("\t")[0] for line in DOCUMENTED.read_text().splitlines()
                  if line and not line.startswith("#")}
    env = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]
    names = {e["name"] for e in env if re.match(r"(NCCL|TORCH)_", e["name"])}
    assert names and names <= documented
    assert {"name": "NCCL_SOCKET_IFNAME", "value": "=eth0"} in env


def test_megatron_pods_carry_megatron_env(tmp_path: Path) -> None:
    """The pods start the megatron target's pretrain_gpt.py with what megatron.env holds (tp>1 without FSDP:
    CUDA_DEVICE_MAX_CONNECTIONS=1), still a valid pod template; another command's pods do not carry it."""
    from gpufleet.emit.megatron import ENV_FILE, MEGATRON
    from gpufleet.planner.search import SearchSpace

    zero1 = spec_from_plan(PlanRequest(model="llama3-70b", gpus=64, top=1, stack="megatron-lm",
                                       search_space=SearchSpace(shardings=("zero1",))))
    env_file = {f.path: f.text for f in MEGATRON.render(zero1)}[ENV_FILE]
    written = dict(line.split("=", 1) for line in env_file.splitlines() if line and not line.startswith("#"))
    assert written == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    _, job = _documents(replace(zero1, train_command=MEGATRON.entrypoint(zero1, str(tmp_path))))
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        validate_pod_template(replica["template"])
        container = replica["template"]["spec"]["containers"][0]
        assert container["command"][:2] == ["torchrun", "pretrain_gpt.py"]
        assert [e for e in container["env"] if e["name"] in written] == [
            {"name": name, "value": value} for name, value in written.items()]
    _, other = _documents(replace(zero1, train_command=("train.py",)))
    env = other["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in {e["name"] for e in env}
