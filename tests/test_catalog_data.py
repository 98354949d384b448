"""The shipped catalog: every entry loads and is sourced, the numbers are sane, references resolve,
and user files override, add, or fail with one clear CatalogError."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.catalog.records import GPUSpec, ModelSpec, NetworkSpec, NodeSpec
from gpufleet.catalog.registry import KINDS, Catalog
from gpufleet.errors import CatalogError, UnknownNameError
from gpufleet.workload.params import count_params

REQUIRED_GPUS = {
    "a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm", "h100-pcie", "h100-sxm-96gb", "h800-sxm",
    "h200-sxm", "b200", "gb200", "mi300x", "mi325x", "mi350x", "mi355x",
}
REQUIRED_MODELS = {
    "gpt3-175b", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b",
    "mixtral-8x7b", "mixtral-8x22b", "deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b", "nemotron4-340b",
}
REQUIRED_NETWORKS = {"hdr200", "ndr400", "xdr800", "roce100", "roce200", "roce400", "roce800", "socket"}
# The run files: the copy shipped in the package when present, else the shared reference folder.
RUN_FOLDERS = (
    Path(__file__).resolve().parents[1] / "src" / "gpufleet" / "catalog" / "runs",
    Path(__file__).resolve().parents[2] / "shared" / "reference",
)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog()


def _gpus(catalog: Catalog) -> list[GPUSpec]:
    return [g for g in catalog.records("gpus").values() if isinstance(g, GPUSpec)]


def _nodes(catalog: Catalog) -> list[NodeSpec]:
    return [n for n in catalog.records("nodes").values() if isinstance(n, NodeSpec)]


# ------------------------------------------------------------------------------------------------
# Loading and sources
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gpus", "nodes", "networks", "models"])
def test_every_builtin_entry_loads_with_a_source(catalog: Catalog, kind: str) -> None:
    records = catalog.records(kind)
    assert records, f"no built-in {kind}"
    for record_id, record in records.items():
        assert isinstance(record, KINDS[kind])
        assert len(record.source.strip()) >= 10, f"{kind} {record_id} has no real source"


def test_exactly_the_required_gpu_ids(catalog: Catalog) -> None:
    assert set(catalog.records("gpus")) == REQUIRED_GPUS


def test_required_models_and_networks_exist(catalog: Catalog) -> None:
    assert set(catalog.records("models")) >= REQUIRED_MODELS
    assert set(catalog.records("networks")) >= REQUIRED_NETWORKS


def test_judgement_defaults_say_so(catalog: Catalog) -> None:
    """An unmeasured scale-up fraction (the 0.80 default) must be marked as a judgement."""
    for gpu in _gpus(catalog):
        if gpu.scale_up.achievable_fraction == 0.80:
            text = f"{gpu.source} {gpu.note or ''}".lower()
            assert "judgement" in text or "measured" in text, gpu.id


# ------------------------------------------------------------------------------------------------
# Numbers are sane
# ------------------------------------------------------------------------------------------------


def test_dense_peaks_increase_as_precision_narrows(catalog: Catalog) -> None:
    for gpu in _gpus(catalog):
        tf = gpu.dense_tflops
        ladder = [v for v in (tf.fp32, tf.tf32, tf.bf16, tf.fp8, tf.fp4) if v is not None]
        assert ladder == sorted(ladder), f"{gpu.id}: dense peaks not monotone {ladder}"
        assert tf.bf16 is not None, f"{gpu.id} lacks bf16"


def test_nvidia_fp16_equals_bf16(catalog: Catalog) -> None:
    for gpu in _gpus(catalog):
        if gpu.vendor == "nvidia":
            assert gpu.dense_tflops.fp16 == gpu.dense_tflops.bf16, gpu.id


def test_peaks_are_dense_not_sparse(catalog: Catalog) -> None:
    # NVIDIA's H100 SXM datasheet headline is 1,979 TFLOP/s BF16 "with sparsity"; dense is half.
    assert catalog.gpu("h100-sxm").peak_flops("bf16") == pytest.approx(989.4e12)
    # GB200 NVL72: 360 PF FP16 with sparsity over 72 GPUs -> 2.5 PF dense per GPU.
    assert catalog.gpu("gb200").peak_flops("bf16") == pytest.approx(360e15 / 72 / 2)


def test_scale_up_shapes(catalog: Catalog) -> None:
    for gpu in _gpus(catalog):
        if gpu.vendor == "amd":
            assert gpu.scale_up.kind == "mesh" and gpu.scale_up.links == 7, gpu.id
        elif gpu.id == "h100-pcie":
            assert gpu.scale_up.kind == "pcie"
        else:
            assert gpu.scale_up.kind == "switched", gpu.id
    assert catalog.gpu("gb200").scale_up.domain_gpus == 72
    # H800: NVLink cut to 400 GB/s bidirectional = 200 per direction (DeepSeek-V3#28).
    assert catalog.gpu("h800-sxm").scale_up.gbytes_per_s_per_direction == 200
    # MI300X: 7 links x 64 GB/s per direction; one pair gets one link.
    mi300x = catalog.gpu("mi300x").scale_up
    assert mi300x.gbytes_per_s_per_direction / (mi300x.links or 1) == pytest.approx(64)


def test_hbm_units(catalog: Catalog) -> None:
    h100 = catalog.gpu("h100-sxm")
    assert h100.hbm_bytes == 80 * 2**30
    assert h100.hbm_bytes_per_s == pytest.approx(3.35e12)


def test_network_fractions_and_rates(catalog: Catalog) -> None:
    for network in catalog.records("networks").values():
        assert isinstance(network, NetworkSpec)
        assert network.endpoint_latency_s > network.hop_latency_s
    socket = catalog.network("socket")
    ndr = catalog.network("ndr400")
    assert socket.kind == "socket"
    assert socket.achievable_fraction < 0.6 < ndr.achievable_fraction
    assert ndr.link_bytes_per_s == pytest.approx(50e9)


# ------------------------------------------------------------------------------------------------
# References resolve
# ------------------------------------------------------------------------------------------------


def test_every_node_gpu_and_network_resolves(catalog: Catalog) -> None:
    for node in _nodes(catalog):
        catalog.gpu(node.gpu)
        catalog.network(node.default_network)


def test_each_gpu_has_a_default_node_that_matches_its_scale_up_domain(catalog: Catalog) -> None:
    for gpu in _gpus(catalog):
        node = catalog.node_for_gpu(gpu.id)
        assert node.gpus == (72 if gpu.id == "gb200" else 8), (gpu.id, node.id)
        assert gpu.scale_up.domain_gpus <= node.gpus


def test_gb200_rack(catalog: Catalog) -> None:
    rack = catalog.node("gb200-nvl72")
    assert (rack.gpus, rack.nics, rack.nic_gbps) == (72, 72, 400)
    assert rack.max_power_w == 120_000


def test_every_model_counts(catalog: Catalog) -> None:
    for model in catalog.records("models").values():
        assert isinstance(model, ModelSpec)
        params = count_params(model)
        assert 0 < params.active <= params.total
        assert (params.active < params.total) == (model.moe is not None), model.id


def _architecture(model: dict[str, Any]) -> str:
    keys = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "gated_mlp", "vocab", "moe")
    shape = {key: model.get(key) for key in keys}
    shape["tied_embeddings"] = bool(model.get("tied_embeddings"))
    if isinstance(shape["moe"], dict):
        shape["moe"] = {"shared_experts": 0, "dense_layers": 0, **shape["moe"]}
        shape["moe"].pop("router", None)  # how tokens are routed, not the shape
        if not shape["moe"]["dense_layers"]:
            shape["ffn_hidden"] = None  # unused when every layer is MoE
    return json.dumps(shape, sort_keys=True)


@pytest.mark.parametrize("runs_file", ["published_runs.yaml", "vtrain_runs.yaml"])
def test_every_published_run_model_is_in_the_catalog(catalog: Catalog, runs_file: str) -> None:
    found = [folder / runs_file for folder in RUN_FOLDERS if (folder / runs_file).exists()]
    if not found:
        pytest.skip(f"{runs_file} not found in {[str(f) for f in RUN_FOLDERS]}")
    path = found[0]
    shipped = {
        _architecture(m.model_dump(exclude_none=True)): m.id
        for m in catalog.records("models").values()
        if isinstance(m, ModelSpec)
    }
    missing = {
        run["model"]["name"]
        for run in yaml.safe_load(path.read_text(encoding="utf-8"))
        if _architecture(run["model"]) not in shipped
    }
    assert not missing, f"run models with no catalog entry of the same shape: {sorted(missing)}"


# ------------------------------------------------------------------------------------------------
# User files
# ------------------------------------------------------------------------------------------------


def _write(path: Path, document: object) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def test_user_file_replaces_an_entry_and_adds_one(tmp_path: Path) -> None:
    builtin = Catalog().gpu("h100-sxm").model_dump(exclude_none=True)
    replaced = {**builtin, "tdp_w": 650, "source": "my own power measurement"}
    added = {**builtin, "id": "h100-sxm-lab", "name": "our lab H100", "source": "our lab"}
    user = _write(tmp_path / "mine.yaml", {"gpus": [replaced, added]})

    catalog = Catalog(user_paths=(user,))
    assert catalog.gpu("h100-sxm").tdp_w == 650
    assert catalog.gpu("h100-sxm").source == "my own power measurement"
    assert catalog.gpu("h100-sxm-lab").name == "our lab H100"
    assert len(catalog.records("gpus")) == len(REQUIRED_GPUS) + 1
    assert Catalog().gpu("h100-sxm").tdp_w == 700  # the shipped entry is untouched


def test_user_folder_is_read(tmp_path: Path) -> None:
    model = Catalog().model("llama3-8b").model_dump(exclude_none=True)
    _write(tmp_path / "a.yaml", {"models": [{**model, "id": "my-8b", "source": "a test"}]})
    assert Catalog(user_paths=(tmp_path,)).model("my-8b").hidden == 4096


def test_malformed_yaml_is_a_catalog_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("gpus:\n  - id: x\n    name: [unclosed\n", encoding="utf-8")
    with pytest.raises(CatalogError, match="not valid YAML"):
        Catalog(user_paths=(broken,)).records("gpus")


def test_bad_field_is_a_catalog_error_naming_the_field(tmp_path: Path) -> None:
    gpu = Catalog().gpu("h100-sxm").model_dump(exclude_none=True)
    bad = _write(tmp_path / "bad.yaml", {"gpus": [{**gpu, "id": "bad-gpu", "hbm_gib": -1}]})
    with pytest.raises(CatalogError, match="hbm_gib"):
        Catalog(user_paths=(bad,)).records("gpus")


def test_unknown_field_is_a_catalog_error(tmp_path: Path) -> None:
    network = Catalog().network("ndr400").model_dump(exclude_none=True)
    bad = _write(tmp_path / "bad.yaml", {"networks": [{**network, "link_gbit": 400}]})
    with pytest.raises(CatalogError, match="link_gbit"):
        Catalog(user_paths=(bad,)).records("networks")


def test_missing_path_is_a_catalog_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="does not exist"):
        Catalog(user_paths=(tmp_path / "nope.yaml",)).records("gpus")


def test_unknown_name_suggests_the_nearest(catalog: Catalog) -> None:
    with pytest.raises(UnknownNameError) as caught:
        catalog.model("llama3-7b")
    assert "llama3-8b" in caught.value.nearest


def test_a_name_like_nothing_gets_no_suggestion(catalog: Catalog) -> None:
    # 'nosuch' shares a few letters with 'ndr400-switch' (difflib ratio ~0.42): a guess that misleads
    with pytest.raises(UnknownNameError) as caught:
        catalog.network("nosuch")
    assert caught.value.nearest == [] and "did you mean" not in str(caught.value)


def test_check_names_a_node_whose_gpu_is_not_in_the_catalog(tmp_path: Path) -> None:
    node = Catalog().node("dgx-h100").model_dump(exclude_none=True)
    bad = _write(tmp_path / "node.yaml", {"nodes": [{**node, "gpu": "nope-gpu"}]})
    with pytest.raises(CatalogError, match=r"nodes entry 'dgx-h100': gpu 'nope-gpu' names no GPU"):
        Catalog(user_paths=(bad,)).check()


def test_check_names_a_node_whose_network_is_not_in_the_catalog(tmp_path: Path) -> None:
    node = Catalog().node("dgx-h100").model_dump(exclude_none=True)
    bad = _write(tmp_path / "node.yaml", {"nodes": [{**node, "default_network": "nope-net"}]})
    with pytest.raises(CatalogError, match="default_network 'nope-net' names no network"):
        Catalog(user_paths=(bad,)).check()


def test_check_validates_kinds_the_caller_never_reads(tmp_path: Path) -> None:
    gpu = {k: v for k, v in Catalog().gpu("h100-sxm").model_dump(exclude_none=True).items() if k != "source"}
    bad = _write(tmp_path / "gpu.yaml", {"gpus": [{**gpu, "id": "my-gpu"}]})
    catalog = Catalog(user_paths=(bad,))
    assert catalog.model("llama3-8b").layers == 32  # reading another kind does not look at the GPU
    with pytest.raises(CatalogError, match="'my-gpu': source"):
        catalog.check()


def test_the_same_id_twice_in_one_file_is_refused(tmp_path: Path) -> None:
    gpu = Catalog().gpu("h100-sxm").model_dump(exclude_none=True)
    bad = _write(tmp_path / "dup.yaml", {"gpus": [gpu, gpu]})
    with pytest.raises(CatalogError, match="'h100-sxm' appears twice"):
        Catalog(user_paths=(bad,)).records("gpus")


def test_check_notes_files_and_folders_that_add_nothing(tmp_path: Path) -> None:
    empty_file = tmp_path / "empty.yaml"
    empty_file.write_text("", encoding="utf-8")
    empty_folder = tmp_path / "nothing-here"
    empty_folder.mkdir()
    notes = Catalog(user_paths=(empty_file, empty_folder)).check()
    assert sorted(notes) == [f"catalog file {empty_file} adds nothing (empty)",
                             f"catalog folder {empty_folder} adds nothing (no .yaml or .yml files in it)"]


def test_check_notes_once_per_catalog(tmp_path: Path) -> None:
    empty_file = tmp_path / "empty.yaml"
    empty_file.write_text("", encoding="utf-8")
    catalog = Catalog(user_paths=(empty_file,))
    assert len(catalog.check()) == 1 and catalog.check() == []  # a command that opens it twice warns once


@pytest.mark.parametrize("bad_id", ["[a, b]", "{a: 1}"])
def test_an_id_that_is_not_text_is_one_catalog_error(tmp_path: Path, bad_id: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"gpus:\n  - id: {bad_id}\n    source: a test\n", encoding="utf-8")
    with pytest.raises(CatalogError, match="gpus entry"):
        Catalog(user_paths=(bad,)).check()


def test_the_builtin_catalog_passes_its_own_check(catalog: Catalog) -> None:
    assert catalog.check() == []
