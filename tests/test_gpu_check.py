"""scripts/gpu-check: its dry path end to end (real processes: the exporter, torchrun with gloo, a SIGKILLed saver
and burn-in worker), the report's documented format, and the pieces a GPU run depends on that can be checked here
(the NVML-vs-nvidia-smi comparison, GPU names to catalog ids, step timeouts, the loss comparison, fp8 GEMMs, a
one-rank host catalog)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.runtime.gpucheck import burnin_check, exporter_check, proc, runner
from gpufleet.runtime.gpucheck.machine import Context, Machine, catalog_gpu_id
from gpufleet.runtime.gpucheck.results import FORMAT, STATUSES, Outcome, Report, StepResult, write_report

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-check"
#: what runs on a CPU (all must pass on the dry path) and what only a GPU can do (skipped there)
GPU_ONLY = {"nvml-vs-nvidia-smi"}
NOT_YET: set[str] = set()  # steps skipped on both paths until what they run exists (none now)
STEP_KEYS = {"name", "title", "status", "reason", "seconds", "timeout_s", "numbers"}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("gpu-check")
    flags = ["--dry-run"] if shutil.which("nvidia-smi") else []  # a GPU machine: still test the dry path
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run([str(SCRIPT), "--out", str(out), *flags], capture_output=True, text=True, env=env,
                          cwd=out, timeout=420, check=False)
    return done, out / "gpu-check"


@pytest.mark.slow
@pytest.mark.runtime
@pytest.mark.timeout(480)
def test_dry_path_passes_every_cpu_step_and_writes_the_report(
        dry_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    done, folder = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    first = done.stdout.splitlines()[0]
    assert first.startswith("no GPU (") and "dry path" in first  # says so in one line
    results = json.loads((folder / "results.json").read_text())
    assert results["format"] == FORMAT and results["mode"] == "dry"
    assert {"started", "wall_s", "machine", "versions", "counts", "steps"} <= results.keys()
    assert [step["name"] for step in results["steps"]] == [step.name for step in runner.STEPS]
    for step in results["steps"]:
        assert step.keys() == STEP_KEYS and step["status"] in STATUSES and step["reason"], step
        assert "\n" not in step["reason"] and step["seconds"] <= step["timeout_s"]
        expected = "skipped" if step["name"] in GPU_ONLY | NOT_YET else "pass"
        assert step["status"] == expected, step
    skipped = len(GPU_ONLY | NOT_YET)
    assert results["counts"] == {"pass": len(runner.STEPS) - skipped, "fail": 0, "skipped": skipped}
    markdown = (folder / "REPORT.md").read_text()
    assert markdown.startswith("# gpu-check report (dry path)")
    for step in results["steps"]:
        assert f"| {step['name']} | {step['status']} |" in markdown and f"## {step['name']}: " in markdown


@pytest.mark.slow
@pytest.mark.runtime
@pytest.mark.timeout(480)
def test_dry_path_figures(dry_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    """The figures each step reports: the loop's predicted and measured step, every resumed loss compared, the
    checkpoint killed while a save was in flight, the plan's parts that the calibration moved."""
    _, folder = dry_run
    steps = {step["name"]: step["numbers"] for step in json.loads((folder / "results.json").read_text())["steps"]}
    for name in ("loop-dense", "loop-moe"):
        loop = steps[name]
        low, high = loop["predicted_interval_s"]
        assert loop["predicted_step_s"] > 0 and loop["measured_step_s"] > 0 and low < loop["predicted_step_s"] < high
        assert loop["ratio_plan_over_measured"] == pytest.approx(loop["predicted_step_s"] / loop["measured_step_s"])
    moe = steps["loop-moe"]
    assert moe["model"] == "moe" and moe["experts"] == burnin_check.DRY_MOE_RUN.shape.experts
    assert moe["parts_ms"]["host.moe"] > 0 and "comm.ep" not in moe["parts_ms"]
    resumed = steps["burnin-kill-resume"]
    assert resumed["differing_steps"] == [] and resumed["compared_steps"] >= burnin_check.DRY_RUN.kill_steps
    assert resumed["against"] == "the uninterrupted loop-dense run"
    ckpt = steps["checkpoint-kill"]
    assert ckpt["same"] is True and ckpt["durable_at_kill"] <= ckpt["step"] < ckpt["saving_at_kill"]
    assert steps["bench-gemm-fp8"]["best_tflops"] > 0 and steps["calibrate"]["gemm_fraction_fp8"]["measured"] > 0
    for model in ("llama3-8b", "mixtral-8x7b"):
        assert "compute.gemm" in steps["plan-calibrated"][model]["parts_moved"]
    assert "host.moe" in steps["plan-calibrated"]["mixtral-8x7b"]["parts_moved"]
    assert (folder / "work" / "exporter" / "metrics.prom").read_text().startswith("# HELP")


def test_unknown_step_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert runner.main(["--only", "exporter-scrape,warp-drive"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "warp-drive: not a step" in err[0]


def _smi(temperature: str = "41", power: str = "118.5", used: str = "1024", util: str = "3") -> str:
    return f"0, {temperature}, {power}, {used}, 143771, 1980, {util}\n"


SCRAPE = {"gpufleet_gpu_temperature_celsius": {"0": 42.0}, "gpufleet_gpu_power_watts": {"0": 121.0},
          "gpufleet_gpu_memory_used_bytes": {"0": 1024 * 2.0**20}, "gpufleet_gpu_memory_total_bytes":
          {"0": 143771 * 2.0**20}, "gpufleet_gpu_sm_clock_hertz": {"0": 1.98e9},
          "gpufleet_gpu_utilization_ratio": {"0": 0.05}}


def test_nvml_readings_agree_with_nvidia_smi_within_tolerance() -> None:
    before, after = exporter_check.parse_smi(_smi()), exporter_check.parse_smi(_smi(temperature="43"))
    problems, figures = exporter_check.compare(SCRAPE, before, after)
    assert problems == [] and len(figures) == len(exporter_check.READINGS)


@pytest.mark.parametrize(("smi", "named"), [(_smi(temperature="30"), "temperature_c"),
                                            (_smi(power="300"), "power_w"),
                                            (_smi(used="4096"), "memory_used_bytes"),
                                            (_smi(util="80"), "utilization_ratio")])
def test_a_reading_outside_its_tolerance_is_named(smi: str, named: str) -> None:
    problems, _ = exporter_check.compare(SCRAPE, exporter_check.parse_smi(smi), exporter_check.parse_smi(smi))
    assert len(problems) == 1 and problems[0].startswith(f"gpu 0 {named}:")


def test_nvidia_smi_not_available_readings_are_not_compared() -> None:
    rows = exporter_check.parse_smi("0, 41, [N/A], 1024, 143771, 1980, [N/A]\n")
    assert rows["0"]["power.draw"] is None
    problems, figures = exporter_check.compare(SCRAPE, rows, rows)
    assert problems == [] and figures["gpu0.power_w"] == "not reported"


def test_nvml_step_fails_on_a_gpu_without_a_scrape(tmp_path: Path) -> None:
    ctx = Context(out=tmp_path, env={}, machine=Machine(hostname="h", gpu_name="NVIDIA H200"), gpu="h200-sxm")
    assert exporter_check.nvml_step(ctx).status == "fail"


@pytest.mark.parametrize(("name", "gib", "gpu_id"), [("NVIDIA H200", 140.0, "h200-sxm"),
                                                     ("NVIDIA H100 80GB HBM3", 79.6, "h100-sxm"),
                                                     ("NVIDIA H100 PCIe", 79.6, "h100-pcie"),
                                                     ("NVIDIA A100-SXM4-40GB", 39.4, "a100-sxm-40gb"),
                                                     ("NVIDIA A100-SXM4-80GB", 79.2, "a100-sxm-80gb"),
                                                     ("NVIDIA B200", 179.0, "b200"), ("Tesla T4", 15.0, None)])
def test_gpu_names_map_to_catalog_ids_that_exist(name: str, gib: float, gpu_id: str | None) -> None:
    from gpufleet.catalog.registry import Catalog

    assert catalog_gpu_id(name, gib) == gpu_id
    if gpu_id is not None:
        assert Catalog().gpu(gpu_id).id == gpu_id


def _ctx(tmp_path: Path) -> Context:
    return Context(out=tmp_path, env=proc.child_env(), machine=Machine(hostname="h", why_no_gpu="test"),
                   gpu="h200-sxm")


def test_a_step_past_its_timeout_fails_and_its_processes_end(tmp_path: Path) -> None:
    """The step's process group is killed (a child of the child too), the step fails with one line, the next runs."""
    def sleeper(ctx: Context) -> Outcome:
        proc.run(["bash", "-c", "sleep 60 & echo $! > child.pid; wait"], ctx.work("s"), ctx.env, ctx.left_s(), "s")
        return Outcome("pass", "never")

    ctx = _ctx(tmp_path)
    slow = runner.Step("slow", "sleeps", sleeper, timeout_s=0.5)
    broken = runner.Step("broken", "raises", lambda _: {}["missing"], timeout_s=5)
    results = [runner.run_step(step, ctx) for step in (slow, broken)]
    assert [r.status for r in results] == ["fail", "fail"]
    assert results[0].reason.startswith("timed out after") and results[0].seconds < 5
    assert results[1].reason == "KeyError: 'missing'"
    child = int((tmp_path / "work" / "s" / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{child}").exists() and "Z" not in Path(f"/proc/{child}/stat").read_text().split()[2]:
        assert time.monotonic() < deadline, "the step's grandchild outlived its timeout"
        time.sleep(0.05)


def _log(path: Path, losses: dict[int, float], restart: int = 0, resumed: int | None = None) -> list[dict[str, Any]]:
    lines = [{"step": step, "loss": loss, "restart": restart, "resumed_from": resumed} for step, loss in losses.items()]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return lines


def test_resumed_losses_must_match_to_the_last_bit(tmp_path: Path) -> None:
    reference = {step: 7.0 - step / 3 for step in range(1, 7)}
    _log(tmp_path / "ref.jsonl", reference)
    first = [{"step": s, "loss": reference[s], "restart": 0, "resumed_from": None} for s in (1, 2, 3, 4)]
    again = [{"step": s, "loss": reference[s], "restart": 1, "resumed_from": 3} for s in (4, 5, 6)]
    good = burnin_check.compare_losses(first + again, 4, tmp_path / "ref.jsonl", 6)
    assert good.status == "pass" and good.numbers["compared_steps"] == 7
    again[1]["loss"] = float.fromhex(float(reference[5]).hex()[:-1] + "1")  # one bit off in the last place
    assert float(again[1]["loss"]) != reference[5]
    bad = burnin_check.compare_losses(first + again, 4, tmp_path / "ref.jsonl", 6)
    assert bad.status == "fail" and bad.numbers["differing_steps"] == [5]
    alone = burnin_check.compare_losses(first + again, 4, None, 6)  # no reference: the twice-run step 4 only
    assert alone.status == "pass" and alone.numbers["compared_steps"] == 1
    assert burnin_check.compare_losses(first, 4, None, 6).status == "fail"  # no restart at all


def test_report_files_follow_the_format(tmp_path: Path) -> None:
    steps = [StepResult("a", "first", "pass", "fine", 1.0, 5.0, {"x": 1.5, "m": {"k": None}}),
             StepResult("b", "second", "skipped", "no | GPU", 0.0, 5.0, {})]
    report = Report("dry", {"hostname": "h", "gpu_name": None}, "2026-12-04T00:00:00Z", 1.0, steps, {"torch": "x"})
    results, markdown = write_report(report, tmp_path / "gpu-check")
    data = json.loads(results.read_text())
    assert data["counts"] == {"pass": 1, "fail": 0, "skipped": 1} and data["steps"][0]["numbers"]["x"] == 1.5
    text = markdown.read_text()
    assert "| b | skipped | 0.0 | no / GPU |" in text and "- m: k -" in text


def test_fp8_gemm_runs_on_the_cpu_and_refuses_shapes_cublas_cannot_take() -> None:
    pytest.importorskip("torch")
    from gpufleet.errors import InputError
    from gpufleet.runtime.bench.gemm import bench_gemm
    from gpufleet.runtime.bench.shapes import GemmShape

    rows = bench_gemm([GemmShape("t", 32, 64, 48)], ["fp8"], iters=1, warmup=0)
    assert rows[0].dtype == "fp8" and rows[0].flops_per_s > 0
    with pytest.raises(InputError, match="multiples of 16"):
        bench_gemm([GemmShape("odd", 32, 64, 40)], ["fp8"], iters=1, warmup=0)


def test_one_rank_host_catalog_loads(tmp_path: Path) -> None:
    """One rank measures no collective (bus bandwidth 0): the catalog still loads, with a positive placeholder link,
    so `burnin --measure-host` works on a single GPU."""
    from gpufleet.catalog.registry import Catalog
    from gpufleet.runtime.burnin.config import ModelShape
    from gpufleet.runtime.burnin.host_catalog import HOST_GPU_ID, HostMeasurement, write_host_catalog

    measured = HostMeasurement(hostname="h", cpu="x", ranks=1, threads_per_rank=1, peak_gemm_flop_per_s=4e11,
                               gemm_shapes=((512, 384, 384, 2, 2e11),), attention_flop_per_s=8e9,
                               elementwise_bytes_per_s=3e9, allgather_busbw_bytes_per_s=0.0,
                               reduce_scatter_busbw_bytes_per_s=0.0, disk_write_bytes_per_s=5e8,
                               disk_read_bytes_per_s=9e8, ram_bytes=32 * 2**30, date="2026-12-04")
    write_host_catalog(tmp_path / "host.yaml", measured, ModelShape())
    catalog = Catalog((tmp_path / "host.yaml",))
    assert catalog.check() == []
    assert catalog.gpu(HOST_GPU_ID).scale_up.bytes_per_s_per_direction == pytest.approx(3e9)
    assert catalog.calibration(HOST_GPU_ID).collectives == ()


def test_detect_reads_nvidia_smi_and_asks_torch_about_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver whose nvidia-smi lists an H200, with this CPU-only torch: the GPU is named and given its catalog id,
    and the check still takes the dry path, saying why in the words of its one line."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA: the dry-path reason below would not apply")
    from gpufleet.runtime.gpucheck.machine import detect

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA H200, 143771, 570.86.15'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    machine = detect(proc.child_env())
    assert (machine.gpu_name, machine.catalog_gpu, machine.gpu_count, machine.driver) == \
        ("NVIDIA H200", "h200-sxm", 1, "570.86.15")
    assert machine.memory_gib == pytest.approx(143771 / 1024)
    assert not machine.on_gpu and machine.why_no_gpu == "nvidia-smi sees a GPU but this torch has no CUDA"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert detect(proc.child_env()).why_no_gpu == "no nvidia-smi on PATH (no NVIDIA driver)"
