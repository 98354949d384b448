"""The bench results' schema (bench_file.py): what `bench --json` writes is what `calibrate --from` and the GPU
check read, each document says which bench wrote it, and a bad field is one line naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clirun import one_error_line, run_gpufleet
from gpufleet.bench_file import DiskBench, HostBench, MemoryBench, read_bench_result
from gpufleet.errors import InputError


def _bench(*args: str) -> dict:
    done = run_gpufleet("bench", *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.runtime
def test_what_the_benches_write_reads_back_as_their_kind(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    disk = _bench("disk", str(tmp_path), "--sizes", "1MiB")
    memory = _bench("memory", "--size", "1MiB", "--iters", "2")
    host = _bench("host", "--iters", "20", "--warmup", "2", "--repeats", "1", "--ops", "elementwise")
    for document, kind in ((disk, DiskBench), (memory, MemoryBench), (host, HostBench)):
        assert isinstance(read_bench_result(document, "test"), kind)
        assert document["kind"] == kind.model_fields["kind"].default
    for name, document in (("disk", disk), ("memory", memory), ("host", host)):
        (tmp_path / f"{name}.json").write_text(json.dumps(document))
    out = tmp_path / "cpu.yaml"
    done = run_gpufleet("calibrate", "--gpu", "h100-sxm", *(f"--from={tmp_path / n}.json" for n in
                                                             ("disk", "memory", "host")), "--out", str(out))
    assert done.returncode == 0, done.stderr and out.exists()


def test_a_document_from_before_the_kind_is_read_by_its_keys() -> None:
    old = {"size_bytes": 2**20, "time_s": 0.001, "bandwidth_gbps": 2.1, "peak_gbps": None, "fraction_of_peak": None,
           "device": "cpu"}
    assert isinstance(read_bench_result(old, "old.json"), MemoryBench)


@pytest.mark.parametrize(("document", "says"), [
    ({"kind": "memory", "size_bytes": 2**20, "time_s": 0.001, "bandwidth_gbps": "fast", "device": "cpu"},
     "bandwidth_gbps"),
    ({"kind": "disk", "path": "/ckpt", "rows": []}, "rows"),
    ({"kind": "host", "host_s_per_kernel": -1.0, "by_op": {}, "device": "cpu", "repeats": 1, "iters": 1,
      "autograd": True}, "host_s_per_kernel"),
    ({"kind": "gpu-burn"}, "not the --json output"),
    ([1, 2], "not the --json output"),
])
def test_a_bad_document_is_one_line_naming_the_field(document: object, says: str) -> None:
    with pytest.raises(InputError, match=says):
        read_bench_result(document, "bench.json")


def test_calibrate_names_the_bad_field_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "memory.json"
    path.write_text(json.dumps({"kind": "memory", "size_bytes": 2**20, "time_s": 0.001, "bandwidth_gbps": -3,
                                "device": "cpu"}))
    line = one_error_line(run_gpufleet("calibrate", "--gpu", "h100-sxm", "--from", str(path), "--out",
                                       str(tmp_path / "o.yaml")))
    assert "bandwidth_gbps" in line and str(path) in line
    assert not (tmp_path / "o.yaml").exists()
