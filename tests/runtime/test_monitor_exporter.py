"""The node exporter: NVML readings through the pynvml seam (a fake NVML here, the real one on a GPU machine),
base units, fault isolation per GPU, InfiniBand sysfs and checkpoint-disk series, `promtool check metrics`, and the
`gpufleet exporter` command's bad-input lines."""

from __future__ import annotations

import inspect
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pynvml
import pytest
from _net import free_port
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).parents[1]))
from clirun import one_error_line, run_gpufleet
from gpufleet.runtime.monitor import nvml as nvml_module
from gpufleet.runtime.monitor.exporter import ExporterConfig, build_registry, open_reader, scrape
from gpufleet.runtime.monitor.fake_nvml import FakeNvml
from gpufleet.runtime.monitor.node_collector import read_ib_ports
from gpufleet.runtime.monitor.nvml import NvmlReader

REPO = Path(__file__).parents[2]


def values(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a scrape, keyed by (name, labels)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def pick(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> list[float]:
    return [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]


def test_the_fake_implements_every_nvml_function_the_reader_calls_with_pynvml_arity() -> None:
    called = set(re.findall(r"\bnvml\.(nvml\w+)", inspect.getsource(nvml_module)))
    called |= set(re.findall(r"self\.nvml\.(nvml\w+)", inspect.getsource(nvml_module)))
    assert len(called) >= 20
    for name in sorted(called):
        real = getattr(pynvml, name)
        fake = getattr(FakeNvml, name)
        # the reader passes arguments by position: the counts must agree (the fake's first is self)
        assert len(_required(real)) == len(_required(fake)) - 1, name


def _required(function: object) -> list[str]:
    return [p.name for p in inspect.signature(function).parameters.values()  # type: ignore[arg-type]
            if p.default is inspect.Parameter.empty]


def test_fake_readings_come_out_in_base_units() -> None:
    sample = NvmlReader(FakeNvml(2)).sample()[1]
    # the fake's NVML units: 1980 MHz, 650000 mW, 80 GiB, 97 %
    assert sample.sm_clock_hz == 1980e6 and sample.sm_clock_base_hz == 1755e6
    assert sample.power_watts == 650.0
    assert sample.memory_total_bytes == 80 * 2**30
    assert sample.utilization_ratio == pytest.approx(0.97)
    assert sample.nvlink is not None and sample.nvlink.links == sample.nvlink.links_active == 18
    assert not sample.slowed_down


def test_injected_throttle_ecc_xid_and_nvlink_faults_show_on_that_gpu_only() -> None:
    fake = FakeNvml(4)
    reader = NvmlReader(fake)
    fake.throttle(2, "hw_thermal")
    fake.ecc(1, corrected=3, uncorrected=1)
    fake.xid(3, 79)
    fake.xid(3, 79)
    fake.xid(0, 48)
    fake.nvlink_down(0, 5)
    first = reader.sample()
    assert first[2].throttle_reasons["hw_thermal"] and first[2].slowed_down and first[2].sm_clock_hz == 1410e6
    assert [s.slowed_down for s in first] == [False, False, True, False]
    assert first[1].ecc_errors_total == {("corrected", "volatile"): 3, ("uncorrected", "volatile"): 1,
                                         ("corrected", "aggregate"): 3, ("uncorrected", "aggregate"): 1}
    assert first[3].xid_errors_total == {79: 2} and first[0].xid_errors_total == {48: 1}
    assert first[0].nvlink is not None and first[0].nvlink.links_active == 17
    assert first[0].nvlink.errors_total["recovery"] == 1
    # events are counted once: a second scrape keeps the totals, it does not add them again
    assert reader.sample()[3].xid_errors_total == {79: 2}


def test_an_nvml_error_on_one_gpu_marks_it_down_and_the_others_still_report() -> None:
    fake = FakeNvml(3)
    config = ExporterConfig(fake_gpus=3)
    registry = build_registry(config, NvmlReader(fake))
    fake.fail(1)
    samples = values(scrape(registry))
    assert pick(samples, "gpufleet_gpu_up", gpu="1") == [0.0]
    assert pick(samples, "gpufleet_gpu_up", gpu="0") == pick(samples, "gpufleet_gpu_up", gpu="2") == [1.0]
    assert pick(samples, "gpufleet_gpu_temperature_celsius", gpu="1") == []
    assert len(pick(samples, "gpufleet_gpu_temperature_celsius")) == 2


def test_the_straggler_check_reads_only_clocks_and_agrees_with_a_full_sample() -> None:
    fake = FakeNvml(2)
    reader = NvmlReader(fake)
    fake.throttle(1, "sw_thermal")
    before = fake.calls
    light = reader.sample_clocks(1)
    assert fake.calls - before == 4
    full = reader.sample_one(1)
    assert light.slowed_down and full.slowed_down
    assert (light.sm_clock_hz, light.sm_clock_base_hz) == (full.sm_clock_hz, full.sm_clock_base_hz)
    assert not reader.sample_clocks(0).slowed_down


def test_a_gpu_lost_before_the_exporter_starts_is_reported_down_not_fatal() -> None:
    fake = FakeNvml(3)
    fake.fail(0)  # nvmlDeviceGetHandleByIndex(0) fails
    reader = NvmlReader(fake)
    samples = reader.sample()
    assert samples[0].error and samples[0].identity.uuid == "unknown-0"
    assert [s.error for s in samples[1:]] == [None, None]


def test_scrape_series_carry_the_gpu_index_label_and_base_unit_names() -> None:
    config = ExporterConfig(fake_gpus=2, fake_events=("1:sw_power_cap", "0:ecc_uncorrected=2"), hostname="node7")
    samples = values(scrape(build_registry(config, open_reader(config))))
    assert pick(samples, "gpufleet_gpu_sm_clock_hertz", gpu="1", hostname="node7") == [1410e6]
    assert pick(samples, "gpufleet_gpu_throttled", gpu="1", reason="sw_power_cap") == [1.0]
    assert pick(samples, "gpufleet_gpu_throttled", gpu="0", reason="sw_power_cap") == [0.0]
    assert pick(samples, "gpufleet_gpu_ecc_errors_total", gpu="0", type="uncorrected", scope="volatile") == [2.0]
    assert pick(samples, "gpufleet_gpu_memory_total_bytes", gpu="0") == [80 * 2**30]


def test_infiniband_ports_from_a_sysfs_tree(tmp_path: Path) -> None:
    def port(device: str, number: str, state: str, xmit_words: int, downed: int) -> None:
        folder = tmp_path / "class" / "infiniband" / device / "ports" / number
        (folder / "counters").mkdir(parents=True)
        (folder / "state").write_text(state + "\n")
        (folder / "rate").write_text("400 Gb/sec (4X NDR)\n")
        (folder / "link_layer").write_text("InfiniBand\n")
        (folder / "counters" / "port_xmit_data").write_text(f"{xmit_words}\n")
        (folder / "counters" / "link_downed").write_text(f"{downed}\n")

    port("mlx5_0", "1", "4: ACTIVE", 1000, 0)
    port("mlx5_1", "1", "1: DOWN", 7, 3)
    ports = {p.device: p for p in read_ib_ports(tmp_path)}
    assert ports["mlx5_0"].active and not ports["mlx5_1"].active
    assert ports["mlx5_0"].counters["port_xmit_data"] == 4000  # 4-octet words
    assert ports["mlx5_1"].counters["link_downed"] == 3
    assert ports["mlx5_0"].rate_bytes_per_s == 400e9 / 8
    config = ExporterConfig(fake_gpus=1, sysfs_root=tmp_path, hostname="n1")
    samples = values(scrape(build_registry(config, open_reader(config))))
    assert pick(samples, "gpufleet_ib_port_up", device="mlx5_1", port="1") == [0.0]
    assert pick(samples, "gpufleet_ib_port_transmit_bytes_total", device="mlx5_0") == [4000.0]
    assert read_ib_ports(tmp_path / "absent") == []


def test_checkpoint_folder_free_space_and_newest_step(tmp_path: Path) -> None:
    for step, mtime in ((10, 1_700_000_000), (20, 1_700_000_500)):
        folder = tmp_path / f"step_{step:012d}"
        folder.mkdir()
        os.utime(folder, (mtime, mtime))
    (tmp_path / "step_000000000030.set-aside-1").mkdir()  # not a committed checkpoint
    config = ExporterConfig(fake_gpus=1, checkpoint_dirs=(tmp_path,))
    samples = values(scrape(build_registry(config, open_reader(config))))
    assert pick(samples, "gpufleet_checkpoint_last_timestamp_seconds") == [1_700_000_500.0]
    stats = os.statvfs(tmp_path)
    free = pick(samples, "gpufleet_checkpoint_free_bytes")[0]
    assert abs(free - stats.f_bavail * stats.f_frsize) < 1e9  # other writers on the disk may move it a little


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_check_metrics_accepts_a_scrape_with_every_fault(tmp_path: Path) -> None:
    (tmp_path / "step_000000000001").mkdir()
    config = ExporterConfig(fake_gpus=8, fake_events=("1:hw_thermal", "2:ecc_corrected=4", "3:xid=79",
                                                      "4:nvlink_down=2", "5:fail"), checkpoint_dirs=(tmp_path,))
    text = scrape(build_registry(config, open_reader(config)))
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_torch_is_not_imported_by_the_exporter_or_the_monitor_package() -> None:
    code = ("import sys, gpufleet.runtime.monitor, gpufleet.runtime.monitor.exporter, gpufleet.cli.exporter; "
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    assert result.stdout.strip() == "False"


@pytest.mark.timeout(120)
def test_gpufleet_exporter_serves_on_loopback_and_stops_after_its_duration() -> None:
    port = free_port()
    started = time.monotonic()
    proc = subprocess.Popen([*_entry(), "exporter", "--fake-gpus", "2", "--listen", f":{port}", "--duration", "20"],
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith(f"serving http://127.0.0.1:{port}/metrics")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            body = response.read().decode()
        assert len(pick(values(body), "gpufleet_gpu_up")) == 2
        proc.terminate()  # SIGTERM stops it cleanly
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - started < 20
    finally:
        proc.kill()


def _entry() -> list[str]:
    from clirun import entry_point

    return entry_point()


def test_exporter_once_prints_a_scrape() -> None:
    result = run_gpufleet("exporter", "--fake-gpus", "3", "--fake-event", "0:hw_thermal", "--once")
    assert result.returncode == 0, result.stderr
    assert pick(values(result.stdout), "gpufleet_gpu_throttled", gpu="0", reason="hw_thermal") == [1.0]


def test_exporter_refuses_a_port_in_use_in_one_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = one_error_line(run_gpufleet("exporter", "--fake-gpus", "1", "--listen", f"127.0.0.1:{port}",
                                           "--duration", "5"))
    assert f"port {port}" in line and "in use" in line


@pytest.mark.parametrize(("args", "words"), [
    (["--plan", "/nonexistent/plan.json"], "the plan file /nonexistent/plan.json does not exist"),
    (["--duration", "0"], "--duration must be a positive"),
    (["--duration", "-3"], "--duration must be a positive"),
    (["--listen", "127.0.0.1:99999"], "--listen must be ADDR:PORT"),
    (["--listen", "localhost"], "--listen must be ADDR:PORT"),
    (["--fake-event", "0:melting"], "--fake-event must be GPU:KIND"),
    (["--fake-event", "9:hw_thermal"], "GPU index must be in [0, 0]"),
])
def test_exporter_bad_input_is_one_line(args: list[str], words: str) -> None:
    line = one_error_line(run_gpufleet("exporter", "--fake-gpus", "1", "--once", *args))
    assert words in line


def test_exporter_refuses_a_plan_file_that_is_not_a_plan(tmp_path: Path) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text("{not json")
    assert "is not JSON" in one_error_line(run_gpufleet("exporter", "--fake-gpus", "1", "--once", "--plan", str(bad)))
    bad.write_text('{"plans": [{"step_s": 2.0, "tokens_per_s_per_gpu": -1, "mfu": 0.4}]}')
    line = one_error_line(run_gpufleet("exporter", "--fake-gpus", "1", "--once", "--plan", str(bad)))
    assert "tokens_per_s_per_gpu must be a positive number" in line
    bad.chmod(0)
    if os.geteuid() != 0:  # root reads anything
        assert "cannot read" in one_error_line(run_gpufleet("exporter", "--fake-gpus", "1", "--plan", str(bad)))


def _nvml_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(_nvml_present(), reason="a real NVML is here: the no-driver message cannot be shown")
def test_without_nvml_the_exporter_says_to_use_fake_gpus() -> None:
    line = one_error_line(run_gpufleet("exporter", "--once"))
    assert "cannot open NVML" in line and "--fake-gpus" in line


@pytest.mark.skipif(not _nvml_present(), reason="no NVIDIA driver here: the real NVML path runs on a GPU machine")
def test_real_nvml_readings_are_sane() -> None:
    reader = NvmlReader(pynvml)
    samples = reader.sample()
    assert samples and all(s.error is None for s in samples)
    for sample in samples:
        assert sample.memory_total_bytes and 0 < sample.memory_total_bytes < 2**40
        assert sample.temperature_celsius is None or 0 < sample.temperature_celsius < 120
        assert sample.sm_clock_max_hz is None or 1e8 < sample.sm_clock_max_hz < 5e9
        assert sample.identity.uuid.startswith(("GPU-", "MIG-"))
    text = scrape(build_registry(ExporterConfig(), reader))
    if shutil.which("promtool"):
        result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                                timeout=60, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
    reader.close()
