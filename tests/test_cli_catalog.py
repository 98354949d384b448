"""`gpufleet catalog list|show` through the real entry point, in a separate process."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from clirun import one_error_line, run_gpufleet
from gpufleet.catalog.registry import ENV_VAR


def test_list_everything() -> None:
    result = gpufleet("catalog", "list")
    assert result.returncode == 0, result.stderr
    for name in ("h100-sxm", "dgx-h100", "ndr400", "llama3-8b"):
        assert name in result.stdout


def test_list_one_kind_as_json() -> None:
    result = gpufleet("catalog", "list", "gpus", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert list(data) == ["gpus"]
    assert "mi355x" in data["gpus"]


def test_every_entry_has_a_one_line_summary() -> None:
    result = gpufleet("catalog", "list", "--json")
    assert result.returncode == 0, result.stderr
    blank = [f"{kind}/{rid}" for kind, entries in json.loads(result.stdout).items()
             for rid, summary in entries.items() if not summary]
    assert not blank
    # a calibration's line carries its own fractions, read here from the loaded catalog
    from gpufleet.catalog.registry import load_catalog

    profile = load_catalog().records("calibrations")["h100-sxm"]
    line = json.loads(result.stdout)["calibrations"]["h100-sxm"]
    assert f"GEMM {profile.gemm_fraction_16bit:.0%}" in line and f"fp8 {profile.gemm_fraction_fp8:.0%}" in line
    assert f"attention {profile.attention_kernel}" in line


def test_show_a_gpu_as_json() -> None:
    result = gpufleet("catalog", "show", "h100-sxm", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["kind"] == "gpus"
    assert data["dense_tflops"]["bf16"] == pytest.approx(989.4)
    assert data["source"]


def test_show_a_moe_model_has_total_and_active_params() -> None:
    result = gpufleet("catalog", "show", "mixtral-8x7b", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    # Mistral AI, 'Mixtral of experts' (2023-12): 46.7B total, 12.9B used per token.
    assert data["params_total"] == pytest.approx(46.7e9, rel=0.005)
    assert data["params_active"] == pytest.approx(12.9e9, rel=0.005)


def test_show_a_dense_model_has_equal_total_and_active() -> None:
    data = json.loads(gpufleet("catalog", "show", "llama3-8b", "--json").stdout)
    # Hugging Face meta-llama/Llama-3.1-8B: 8.03B parameters.
    assert data["params_total"] == pytest.approx(8.03e9, rel=0.005)
    assert data["params_active"] == data["params_total"]


def test_show_for_people() -> None:
    result = gpufleet("catalog", "show", "gb200-nvl72")
    assert result.returncode == 0, result.stderr
    assert "gb200" in result.stdout and "source" in result.stdout


def test_unknown_name_is_one_line_with_the_nearest_names() -> None:
    result = gpufleet("catalog", "show", "llama3-7b")
    line = one_error_line(result)
    assert "llama3-7b" in line
    assert "llama3-8b" in line
    assert result.stdout == ""


def test_unknown_kind_is_one_line() -> None:
    line = one_error_line(gpufleet("catalog", "list", "switches"))
    assert "switches" in line and "gpus" in line


def test_malformed_catalog_file_is_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("models:\n  - id: x\n    name: [unclosed\n", encoding="utf-8")
    line = one_error_line(gpufleet("catalog", "list", "--catalog", str(broken)))
    assert "broken.yaml" in line
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(256)))  # not text at all
    line = one_error_line(gpufleet("catalog", "list", "gpus", env_catalog=str(binary)))
    assert "binary.yaml" in line and "not UTF-8" in line


def test_catalog_file_with_a_bad_field_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    incomplete = {"id": "net", "name": "n", "source": "me"}  # no link_gbps, radix, …
    bad.write_text(yaml.safe_dump({"networks": [incomplete]}), encoding="utf-8")
    line = one_error_line(gpufleet("catalog", "list", "networks", "--catalog", str(bad)))
    assert "net" in line and "bad.yaml" in line


def _my_model(path: Path, model_id: str) -> Path:
    model = {
        "id": model_id, "name": "My 1B", "source": "our own config", "layers": 16, "hidden": 2048,
        "heads": 16, "kv_heads": 16, "ffn_hidden": 8192, "gated_mlp": True, "vocab": 32000,
    }
    path.write_text(yaml.safe_dump({"models": [model]}), encoding="utf-8")
    return path


def test_environment_variable_adds_entries(tmp_path: Path) -> None:
    user = _my_model(tmp_path / "mine.yaml", "my-1b")
    result = gpufleet("catalog", "show", "my-1b", "--json", env_catalog=str(user))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["source"] == "our own config"
    # 16 x (4 x 2048^2 + 3 x 2048 x 8192 + 2 x 2048) + 2 x 32000 x 2048 + 2048, by hand:
    assert data["params_total"] == 16 * (4 * 2048**2 + 3 * 2048 * 8192 + 2 * 2048) + 2 * 32000 * 2048 + 2048


def test_catalog_option_overrides_a_builtin_entry(tmp_path: Path) -> None:
    user = _my_model(tmp_path / "mine.yaml", "llama3-8b")
    data = json.loads(gpufleet("catalog", "show", "llama3-8b", "--json", "--catalog", str(user)).stdout)
    assert data["name"] == "My 1B"


def gpufleet(*args: str, env_catalog: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_gpufleet(*args, env={ENV_VAR: env_catalog} if env_catalog is not None else None)
