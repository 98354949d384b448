"""The burn-in job as real processes: torchrun with gloo workers, a worker killed with SIGKILL, torchrun's own
restart, and the resumed losses compared bit for bit with an uninterrupted run."""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _net import free_port
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.runtime.burnin.host_catalog import HALF_DIM_GRID

sys.path.insert(0, str(Path(__file__).parents[1]))
from clirun import one_error_line, run_gpufleet

pytestmark = [pytest.mark.runtime, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
#: A small run whose step is mostly GEMMs and attention (about half a second per step on one busy core), so that
#: the planner's compute model has something to price: 2 blocks of width 384, 512 tokens per rank per step.
LAYERS, HIDDEN, HEADS, FFN, VOCAB, SEQ, MICRO_BATCH = 2, 384, 6, 1536, 1024, 128, 4
SHAPE = ["--layers", str(LAYERS), "--hidden", str(HIDDEN), "--heads", str(HEADS), "--ffn-hidden", str(FFN),
         "--vocab", str(VOCAB), "--seq-len", str(SEQ), "--micro-batch", str(MICRO_BATCH)]
STEPS = 12
#: The measured run is longer: the plan/burn-in ratio's spread over trials shrinks with steps and measurement rounds
#: (12 steps, 4 rounds: 0.88-1.28; 24 steps, 8 rounds: 0.94-1.05 with or without busy neighbours, docs/burnin.md)
LOOP_STEPS = 24
CHECKPOINT_EVERY = 3
RANKS = 2


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    env["OMP_NUM_THREADS"] = "1"
    return env


def torchrun(folder: Path, *, max_restarts: int = 0, checkpoint_every: int = CHECKPOINT_EVERY, steps: int = STEPS,
             extra: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    """torchrun with an explicit c10d rendezvous on a free loopback port (not --standalone)."""
    args = [*TORCHRUN, "--nnodes", "1", "--nproc-per-node", str(RANKS), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", str(max_restarts),
            "--monitor-interval", "0.2", "-m", "gpufleet", "burnin", "--steps", str(steps),
            "--checkpoint-dir", str(folder / "ckpt"), "--log-file", str(folder / "log.jsonl"),
            "--checkpoint-every", str(checkpoint_every), *SHAPE, *extra]
    return subprocess.Popen(args, cwd=folder, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def finish(proc: subprocess.Popen[str], timeout_s: float = 150) -> str:
    out, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, out[-4000:]
    return out


def _workers(parent: int) -> dict[int, int]:
    """rank -> pid of the worker processes torchrun `parent` started."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            env = dict(item.split("=", 1) for item in (entry / "environ").read_text().split("\0") if "=" in item)
        except (OSError, IndexError, ValueError):
            continue
        if "RANK" in env:
            found[int(env["RANK"])] = int(entry.name)
    return found


@pytest.fixture(scope="module")
def uninterrupted_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run nobody kills, saving only at the end: its steps are pure training, which is what the planner's step
    prices (and checkpoints must not change what is trained). It measures the host first (--measure-host), as a
    user closing the loop would. The CI machine's cores are shared with other jobs, so kernels are timed in process
    CPU seconds (--measure-clock cpu) and compared with the log's cpu_s: other jobs' load stretches wall times by
    several times, minute to minute. Its measurement rounds between the steps must not change a loss: the killed
    run, which does not measure, is compared with it bit for bit."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    out = finish(torchrun(folder, checkpoint_every=LOOP_STEPS, steps=LOOP_STEPS,
                          extra=("--measure-host", str(folder / "host.yaml"), "--measure-clock", "cpu", "--json")))
    (folder / "stdout.txt").write_text(out)
    return folder


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_run: Path) -> list[dict[str, Any]]:
    return read_log(uninterrupted_run / "log.jsonl")


@pytest.mark.timeout(300)
def test_uninterrupted_run_logs_every_step_and_learns(uninterrupted: list[dict[str, Any]]) -> None:
    assert [line["step"] for line in uninterrupted] == list(range(1, LOOP_STEPS + 1))
    assert all(line["restart"] == 0 and line["resumed_from"] is None for line in uninterrupted)
    # 10 % of the tokens are random, the rest follow a fixed successor table: a model that learns drops well
    # below the ln(1024) = 6.93 of a uniform guess within a dozen steps
    assert uninterrupted[0]["loss"] == pytest.approx(math.log(VOCAB), abs=0.3)
    assert uninterrupted[-1]["loss"] < uninterrupted[0]["loss"] - 0.5


@pytest.mark.timeout(300)
def test_killed_worker_resumes_bit_for_bit(tmp_path: Path, uninterrupted: list[dict[str, Any]]) -> None:
    proc = torchrun(tmp_path, max_restarts=2)
    log, latest = tmp_path / "log.jsonl", tmp_path / "ckpt" / "latest"
    deadline = time.monotonic() + 120
    while not (latest.exists() and log.exists() and len(read_log(log)) >= CHECKPOINT_EVERY + 2):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before a worker could be killed"
        time.sleep(0.01)
    victim = _workers(proc.pid)[1]
    os.kill(victim, signal.SIGKILL)
    out = finish(proc)
    lines = read_log(log)
    restarted = [line for line in lines if line["restart"] > 0]
    assert restarted, f"no step ran after the restart:\n{out[-3000:]}"
    resumed = restarted[0]["resumed_from"]
    assert resumed is not None and resumed % CHECKPOINT_EVERY == 0 and resumed >= CHECKPOINT_EVERY
    assert [line["step"] for line in restarted] == list(range(resumed + 1, STEPS + 1))
    killed_at = max(line["step"] for line in lines if line["restart"] == 0)
    assert resumed <= killed_at, "resumed from a step the killed group never reached"
    reference = {line["step"]: line["loss"] for line in uninterrupted}
    for line in lines:  # before and after the kill: the same losses as the run nobody killed, to the last bit
        assert float(line["loss"]).hex() == float(reference[line["step"]]).hex(), line


def test_torchrun_leaves_every_burnin_flag_to_the_script() -> None:
    """torchrun's parser takes abbreviations of its own options from anywhere on the line (`--log` would become
    `--log-dir`/`--logs-specs`): every flag `gpufleet burnin` has must reach the script untouched."""
    import typer
    from torch.distributed.run import parse_args

    from gpufleet.cli.main import build_app

    command = typer.main.get_command(build_app()).commands["burnin"]  # type: ignore[attr-defined]
    flags = [opt for param in command.params for opt in param.opts if opt.startswith("--")]
    assert {"--steps", "--checkpoint-dir", "--log-file"} <= set(flags)
    for flag in flags:
        script_args = ["burnin", flag, "1"]
        parsed = parse_args(["--nproc-per-node", "2", "-m", "gpufleet", *script_args])
        assert parsed.training_script_args == script_args, flag
    with pytest.raises(SystemExit):  # the hazard is real: a flag spelled --log never reaches the script
        parse_args(["--nproc-per-node", "2", "-m", "gpufleet", "burnin", "--log", "x"])


def test_burnin_without_torchrun_says_how_to_launch() -> None:
    line = one_error_line(run_gpufleet("burnin", "--steps", "2", env={"RANK": "", "WORLD_SIZE": ""}))
    assert "torchrun --nproc-per-node" in line


def test_burnin_refuses_bad_numbers() -> None:
    assert "--steps" in one_error_line(run_gpufleet("burnin", "--steps", "0"))
    assert "hidden (100) must be a multiple of heads (3)" in one_error_line(
        run_gpufleet("burnin", "--hidden", "100", "--heads", "3"))
    assert "--measure-clock must be wall or cpu" in one_error_line(
        run_gpufleet("burnin", "--measure-host", "h.yaml", "--measure-clock", "tsc"))
    assert "--backend must be gloo or nccl" in one_error_line(run_gpufleet("burnin", "--backend", "mpi"))
    assert "--measure-rounds must be a whole number from 1 to 32, got 0" in one_error_line(
        run_gpufleet("burnin", "--measure-host", "h.yaml", "--measure-rounds", "0"))


@pytest.fixture(scope="module")
def uninterrupted_report(uninterrupted_run: Path) -> dict[str, Any]:
    """Rank 0's --json document (the only JSON object in the run's output: the other rank prints nothing)."""
    out = (uninterrupted_run / "stdout.txt").read_text()
    start = out.index("\n{\n") + 1 if not out.startswith("{\n") else 0
    report, _ = json.JSONDecoder().raw_decode(out[start:])
    assert isinstance(report, dict)
    return report


@pytest.mark.timeout(300)
def test_plan_for_this_host_predicts_the_burnin_step(uninterrupted_run: Path, uninterrupted: list[dict[str, Any]],
                                                     uninterrupted_report: dict[str, Any]) -> None:
    """The loop closes: the host measured itself between the burn-in's steps (GEMMs, attention, element-wise
    kernels, gloo collectives bare and as FSDP2 runs them, the optimizer, the disk), the planner priced the burn-in's
    own layout on that catalog entry, and the prediction lands within 20 % of the step time the burn-in measured
    (both in CPU seconds of a rank, see `uninterrupted_run`). Nothing here is fitted to the burn-in's step times.
    The request is built here by hand from what the burn-in runs, and the burn-in's own end-of-run comparison must
    report the same prediction."""
    from gpufleet.catalog.registry import Catalog
    from gpufleet.perf.step import StepOptions
    from gpufleet.planner.plan import PlanRequest, make_plan
    from gpufleet.planner.search import SearchSpace
    from gpufleet.runtime.burnin.config import MODEL_ID
    from gpufleet.runtime.burnin.host_catalog import HOST_GPU_ID, HOST_NODE_ID

    catalog = Catalog((uninterrupted_run / "host.yaml",))
    assert catalog.check() == []
    # What the burn-in runs: FSDP2 over both ranks (dp 2, sharded parameters, no recompute), eager PyTorch, PyTorch's
    # cross-entropy (40 bytes per logit: perf.compute), and no overlap of communication with compute (on a CPU the
    # same cores run gloo and the GEMMs: a judgement about the host, not a fit)
    options = StepOptions(dp_overlap=False, fused_elementwise=False, loss_bytes_per_logit=40.0)
    space = SearchSpace(micro_batches=(MICRO_BATCH,), shardings=("fsdp",), recomputes=("none",), vpps=(1,),
                        cps=(1,), max_tp=1, partial_recompute=False, activation_offload=False)
    request = PlanRequest(model=MODEL_ID, tokens=1e9, gpu=HOST_GPU_ID, gpus=RANKS, node=HOST_NODE_ID, seq_len=SEQ,
                          global_batch=MICRO_BATCH * RANKS, options=options, search_space=space, top=1)
    result = make_plan(request, catalog)
    layouts = {(c.layout.tp, c.layout.pp, c.layout.dp): c for c in result.search.feasible}
    predicted_s = layouts[(1, 1, RANKS)].step.step_s
    measured_s = statistics.median(line["cpu_s"] for line in uninterrupted if line["step"] > 2)  # after warm-up
    parts = {name: round(part.exposed_s, 4) for name, part in layouts[(1, 1, RANKS)].step.parts.items()}
    print(f"plan {predicted_s:.4f} s, burn-in {measured_s:.4f} s (CPU s per step), plan/burn-in "
          f"{predicted_s / measured_s:.3f}; plan parts {parts}")
    loop = uninterrupted_report["host"]["loop"]
    assert loop["clock"] == "cpu" and uninterrupted_report["host"]["measured"]["rounds"] == 8
    assert loop["predicted_step_s"] == pytest.approx(predicted_s, rel=1e-12)
    assert loop["measured_step_s"] == pytest.approx(measured_s, rel=1e-12)
    # Measured in rounds between the steps (each figure the median over 8 rounds, the step the median over 22), the
    # ratio held within 20 % in every such trial recorded in docs/burnin.md, on a quiet host and with busy
    # neighbours; measured in one round before training it ran to 1.26 with bursty neighbours and 1.42 once in the
    # whole suite on a CI machine.
    ratio = predicted_s / measured_s
    assert 0.8 <= ratio <= 1.2, f"plan {predicted_s:.3f} s, burn-in {measured_s:.3f} s, parts {parts}"


@given(first=st.integers(1, 50), steps=st.integers(0, 60), rounds=st.integers(1, 32))
def test_measurement_rounds_start_at_the_first_step_and_spread_over_the_run(first: int, steps: int,
                                                                            rounds: int) -> None:
    from gpufleet.runtime.burnin.measure import measure_steps

    at = measure_steps(first, first + steps - 1, rounds)
    assert len(at) == min(rounds, steps)
    if steps:
        assert at[0] == first and at[-1] <= first + steps - 1
        assert list(at) == sorted(set(at))
        gaps = [b - a for a, b in itertools.pairwise(at)]
        assert not gaps or max(gaps) - min(gaps) <= 1  # evenly spread


def test_host_figures_are_the_median_over_rounds_by_hand(tmp_path: Path) -> None:
    """Three rounds, each already the slowest rank's: every figure is the middle one; the rates of seconds (FSDP2's
    time, the optimizer's) are inverted back. A burst in one round (the third, everything 4x slower) moves nothing.
    A figure some rounds did not measure (NaN) is the median of the rounds that did."""
    from gpufleet.runtime.burnin.config import BurninConfig, ModelShape
    from gpufleet.runtime.burnin.measure import host_measurement, model_gemm_shapes

    config = BurninConfig(steps=3, checkpoint_dir=tmp_path, log_file=tmp_path / "l", shape=ModelShape(layers=1),
                          measure_clock="cpu")
    figures = 1 + len(model_gemm_shapes(config)) + 8
    quiet = [10.0] * figures
    slower = [8.0] * figures
    burst = [2.5] * figures
    burst[-2:] = [math.nan, math.nan]  # the disk (the last two figures) is measured in the first rounds only
    slower[-2:] = [math.nan, math.nan]
    measured = host_measurement(config, [quiet, slower, burst], ranks=2)
    assert measured.rounds == 3 and measured.clock == "cpu"
    assert measured.peak_gemm_flop_per_s == 8.0 and measured.attention_flop_per_s == 8.0
    assert {rate for *_, rate in measured.gemm_shapes} == {8.0}
    assert measured.fsdp_block_comm_s == pytest.approx(1 / 8) and measured.optimizer_s_per_param == pytest.approx(1 / 8)
    assert measured.reduce_scatter_busbw_bytes_per_s == 8.0
    assert measured.disk_write_bytes_per_s == 10.0 == measured.disk_read_bytes_per_s  # the one round that measured it


def test_host_records_load_as_a_catalog(tmp_path: Path) -> None:
    """The written file is a catalog the registry accepts: every record validates and every reference resolves."""
    from gpufleet.catalog.registry import Catalog
    from gpufleet.runtime.burnin.config import MODEL_ID, ModelShape
    from gpufleet.runtime.burnin.host_catalog import HOST_GPU_ID, HostMeasurement, write_host_catalog

    measured = HostMeasurement(hostname="h", cpu="AMD EPYC 9654", ranks=2, threads_per_rank=1,
                               peak_gemm_flop_per_s=4e11, gemm_shapes=((512, 384, 384, 2, 2e11),),
                               attention_flop_per_s=8e9, elementwise_bytes_per_s=3e9,
                               allgather_busbw_bytes_per_s=2e8, reduce_scatter_busbw_bytes_per_s=1e8,
                               disk_write_bytes_per_s=5e8, disk_read_bytes_per_s=9e8, ram_bytes=32 * 2**30,
                               date="2026-12-01")
    write_host_catalog(tmp_path / "host.yaml", measured, ModelShape())
    catalog = Catalog((tmp_path / "host.yaml",))
    assert catalog.check() == []
    gpu = catalog.gpu(HOST_GPU_ID)
    assert gpu.peak_flops("bf16") == 4e11 and gpu.hbm_bytes_per_s == 3e9
    assert gpu.scale_up.bytes_per_s_per_direction == pytest.approx(1e8)  # the slower of the two collectives
    assert catalog.calibration(HOST_GPU_ID).attention_fraction == pytest.approx(8e9 / 4e11)
    assert catalog.model(MODEL_ID).learned_positions == ModelShape().seq_len
    # measured without FSDP2's extra time: no collective points; the disk is all ranks' concurrent writes
    assert catalog.calibration(HOST_GPU_ID).collectives == ()
    assert catalog.calibration(HOST_GPU_ID).checkpoint_write_gbytes_per_s == pytest.approx(2 * 5e8 / 1e9)


def test_fsdp_collectives_share_fsdp2s_extra_time_by_hand() -> None:
    """One block of 1000 parameters on 2 ranks: bare all-gather (2000 B, bus factor 1/2) at 0.2 GB/s takes 5 us, the
    fp32 reduce-scatter (4000 B) at 0.1 GB/s 20 us; FSDP2's two all-gathers and a reduce-scatter, 30 us bare, took
    60 us: both bus bandwidths halve."""
    from gpufleet.runtime.burnin.host_catalog import HostMeasurement, fsdp_collectives

    measured = HostMeasurement(hostname="h", cpu="x", ranks=2, threads_per_rank=1, peak_gemm_flop_per_s=1e11,
                               gemm_shapes=(), attention_flop_per_s=1e9, elementwise_bytes_per_s=1e9,
                               allgather_busbw_bytes_per_s=2e8, reduce_scatter_busbw_bytes_per_s=1e8,
                               disk_write_bytes_per_s=1e8, disk_read_bytes_per_s=1e8, ram_bytes=2**30,
                               date="2026-12-01", fsdp_block_comm_s=60e-6, block_params=1000)
    assert [(p["op"], p["size_bytes"], p["busbw_gbytes_per_s"]) for p in fsdp_collectives(measured)] == [
        ("all-gather", 2000, pytest.approx(0.1)), ("reduce-scatter", 4000, pytest.approx(0.05))]


GEMM_DIMS = st.tuples(st.integers(16, 4096), st.integers(16, 4096), st.integers(16, 4096), st.integers(1, 4))


@given(half=st.sampled_from(HALF_DIM_GRID[4:-4]), dims=st.lists(GEMM_DIMS, min_size=1, max_size=6))
def test_half_dim_fit_recovers_the_curve_it_came_from(half: int, dims: list[tuple[int, int, int, int]]) -> None:
    """Rates made by the compute model's own shape curve give back its half dimension (a second method: the
    curve evaluated forward, then inverted by the fit)."""
    from gpufleet.runtime.burnin.host_catalog import fit_half_dim

    peak = 1e12
    shapes = tuple((m, n, k, count, peak * m / (m + half) * n / (n + half) * k / (k + half)) for m, n, k, count in dims)
    assert fit_half_dim(peak, shapes) == half


#: The MoE burn-in: the same 2 x 384 model with every MLP a mixture of 4 GELU experts of width 768, top-2 (the same
#: FLOPs per token as the dense model's 1536-wide MLP), for a few steps and 2 measurement rounds.
MOE = ["--experts", "4", "--top-k", "2", "--ffn-hidden", "768"]
MOE_STEPS = 6


def _moe_run(folder: Path) -> tuple[str, list[dict[str, Any]]]:
    out = finish(torchrun(folder, checkpoint_every=MOE_STEPS, steps=MOE_STEPS,
                          extra=(*MOE, "--measure-host", str(folder / "host.yaml"), "--measure-rounds", "2",
                                 "--measure-clock", "cpu")), timeout_s=240)
    return out, read_log(folder / "log.jsonl")


@pytest.mark.torchrun
@pytest.mark.timeout(480)
def test_moe_burnin_writes_its_host_catalog_prints_the_loop_and_repeats_its_losses(tmp_path: Path) -> None:
    """`burnin --experts 4 --top-k 2 --measure-host` under torchrun with gloo on 2 ranks: every loss finite, the host
    catalog describes the MoE model with its `moe:` block (priced by the planner at the burn-in's own layout), the
    loop line is printed, and a second run logs the same losses bit for bit (routing included)."""
    from gpufleet.catalog.registry import Catalog
    from gpufleet.runtime.burnin.config import MOE_MODEL_ID

    runs = []
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        runs.append(_moe_run(tmp_path / name))
    out, log = runs[0]
    losses = [line["loss"] for line in log]
    assert [line["step"] for line in log] == list(range(1, MOE_STEPS + 1))
    assert all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0]
    assert [float(loss).hex() for loss in losses] == [float(line["loss"]).hex() for line in runs[1][1]]
    text = out.replace("\n", "")  # the console wraps long lines at a space, which it keeps
    loop_line = text[text.index("plan "):text.index("burn-in: ")]
    assert " s/step (" in loop_line and "burn-in " in loop_line and "plan/burn-in " in loop_line
    assert "host.moe" in loop_line and "comm.ep" not in loop_line  # ep=1: every rank computes every expert
    model = Catalog((tmp_path / "first" / "host.yaml",)).model(MOE_MODEL_ID)
    assert model.moe is not None and (model.moe.experts, model.moe.top_k, model.moe.expert_ffn_hidden) == (4, 2, 768)
    print(loop_line)
