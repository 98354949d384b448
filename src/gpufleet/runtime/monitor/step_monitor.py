"""StepMonitor: a few lines in a training loop record step time, tokens/s, MFU, data wait and checkpoint stall per
rank, compare them with the plan, score stragglers over the process group and watch for hangs.

    monitor = StepMonitor(plan="plan.json", port=9500)        # serves 127.0.0.1:9500+LOCAL_RANK/metrics
    for batch in loader:
        with monitor.step(tokens=batch.numel()):
            with monitor.compute():
                loss = model(batch); loss.backward()
            optimizer.step()                                   # the gradient all-reduce waits in here
        if step % 500 == 0:
            with monitor.checkpoint():
                manager.save(step, state)

Export: one registry per rank, served on its own port (`port + local_rank`), every series labelled rank,
local_rank, gpu and hostname (chosen over prometheus-client's multiprocess mode, which needs an environment
variable set before import and a shared folder, and loses a rank's series when it dies; a per-rank port also
tells Prometheus at once which rank stopped answering). torch is imported only when the straggler exchange runs.
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpufleet.errors import InputError
from gpufleet.runtime.monitor import straggler
from gpufleet.runtime.monitor.nvml import NvmlReader
from gpufleet.runtime.monitor.plan_target import PlanTarget
from gpufleet.runtime.monitor.watchdog import HangReport, HangWatchdog

LOG = logging.getLogger("gpufleet.monitor")
RANK_LABELS = ("rank", "local_rank", "gpu", "hostname")
#: Step-time histogram buckets, seconds (judgement: 10 ms .. 10 min, x2 apart, covers a step of any model).
STEP_BUCKETS_S = tuple(0.01 * 2**i for i in range(17))


@dataclass(frozen=True)
class StepSummary:
    """The last window of steps on this rank (medians), against the plan when one was given."""

    steps: int
    step_s: float
    compute_s: float | None
    tokens_per_s: float | None
    mfu: float | None
    plan_ratio: float | None  # plan step time / measured step time: 1.0 on plan, 0.8 = 20 % slower

    def line(self) -> str:
        parts = [f"{self.steps} steps", f"step {self.step_s:.4f} s"]
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:,.0f} tokens/s")
        if self.mfu is not None:
            parts.append(f"MFU {self.mfu:.3f}")
        if self.plan_ratio is not None:
            parts.append(f"running at {self.plan_ratio:.2f} of plan")
        return ", ".join(parts)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else default


class _Metrics:
    """The per-rank series, created once with their labels fixed (children cached: a step costs microseconds)."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]) -> None:
        def gauge(name: str, text: str) -> Any:
            return Gauge(name, text, RANK_LABELS, registry=registry).labels(**labels)

        def counter(name: str, text: str) -> Any:
            return Counter(name, text, RANK_LABELS, registry=registry).labels(**labels)

        self.steps = counter("gpufleet_train_steps", "Training steps finished on this rank.")
        self.tokens = counter("gpufleet_train_tokens", "Tokens this rank processed.")
        self.step_seconds = Histogram("gpufleet_train_step_seconds", "Wall time of each step.", RANK_LABELS,
                                      buckets=STEP_BUCKETS_S, registry=registry).labels(**labels)
        self.data_wait = counter("gpufleet_train_data_wait_seconds", "Time spent waiting for input data.")
        self.checkpoint_stall = counter("gpufleet_train_checkpoint_stall_seconds",
                                        "Time training was stopped for checkpoint saves.")
        self.last_step = gauge("gpufleet_train_last_step_timestamp_seconds", "When the last step ended (Unix s).")
        self.last_checkpoint = gauge("gpufleet_train_last_checkpoint_timestamp_seconds",
                                     "When the last checkpoint save on this rank ended (Unix s).")
        self.step_median = gauge("gpufleet_train_step_median_seconds", "Median step time over the last window.")
        self.tokens_per_s = gauge("gpufleet_train_tokens_per_second", "Tokens/s of this rank over the last window.")
        self.mfu = gauge("gpufleet_train_mfu_ratio", "Model FLOPs utilization over the last window.")
        self.plan_ratio = gauge("gpufleet_train_plan_ratio", "Plan step time / measured median step time "
                                "(1 = on plan, below 1 = slower than planned).")
        self.plan_step = gauge("gpufleet_train_plan_step_seconds", "Step time the plan predicts.")
        self.score = gauge("gpufleet_train_straggler_score", "Median over ranks / this rank's median time "
                           "(1 = typical, 0.5 = twice as slow).")
        self.straggler = gauge("gpufleet_train_straggler", "1 while this rank scores below the straggler threshold.")
        self.hang = gauge("gpufleet_train_hang", "1 once the hang watchdog fired on this rank.")
        self.info = gauge("gpufleet_train_rank_info", "1 for every rank; joins GPU series (gpu, hostname) to "
                          "ranks.")


class StepMonitor:
    """Per-rank training metrics, plan comparison, straggler scoring and the hang watchdog."""

    def __init__(self, *, plan: PlanTarget | Path | str | None = None, plan_index: int = 0,
                 registry: CollectorRegistry | None = None, port: int | None = None, host: str = "127.0.0.1",
                 window: int = 50, straggler_every: int = 50, straggler_threshold: float = straggler.DEFAULT_THRESHOLD,
                 group: Any = None, rank: int | None = None, local_rank: int | None = None,
                 world_size: int | None = None, gpu_reader: NvmlReader | None = None, gpu_index: int | None = None,
                 hang_timeout_s: float | None = None, stack_dir: Path | str = "hang-stacks",
                 exit_on_hang: bool = False, exit_grace_s: float = 5.0, flops_per_token: float | None = None,
                 peak_flops_per_s: float | None = None) -> None:
        for name, value in (("window", window), ("straggler_every", straggler_every)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name} must be a whole number of steps >= 1, got {value!r}")
        self.threshold = straggler.check_threshold(straggler_threshold)
        self.plan = PlanTarget.from_file(Path(plan), plan_index) if isinstance(plan, str | Path) else plan
        self.group = group
        self.rank, self.local_rank, self.world_size = self._identity(rank, local_rank, world_size)
        self.hostname = socket.gethostname()
        self.gpu_reader = gpu_reader
        self.gpu_index = self.local_rank if gpu_index is None else gpu_index
        self.flops_per_token, self.peak_flops_per_s = flops_per_token, peak_flops_per_s
        self.straggler_every = straggler_every
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.metrics = _Metrics(self.registry, {"rank": str(self.rank), "local_rank": str(self.local_rank),
                                                "gpu": str(self.gpu_index), "hostname": self.hostname})
        self.metrics.info.set(1)
        if self.plan is not None:
            self.metrics.plan_step.set(self.plan.step_s)
        self._steps_s: deque[float] = deque(maxlen=window)
        self._compute_s: deque[float] = deque(maxlen=window)
        self._tokens: deque[int] = deque(maxlen=window)
        self._step_compute_s = 0.0
        self._group_up = False
        self.steps = 0
        self.hosts: list[str] | None = None
        self.last_report: straggler.StragglerReport | None = None
        self.server = None if port is None else self._serve(host, port + self.local_rank)
        self.watchdog = None if hang_timeout_s is None else HangWatchdog(
            hang_timeout_s, Path(stack_dir), self.rank, exit_on_hang, exit_grace_s, self._hung)

    def _identity(self, rank: int | None, local_rank: int | None, world: int | None) -> tuple[int, int, int]:
        """Rank, local rank and world size: as given, else torchrun's / Slurm's environment, else a single rank."""
        rank = rank if rank is not None else _env_int("RANK", _env_int("SLURM_PROCID", 0))
        local = local_rank if local_rank is not None else _env_int("LOCAL_RANK", _env_int("SLURM_LOCALID", 0))
        world = world if world is not None else _env_int("WORLD_SIZE", _env_int("SLURM_NTASKS", 1))
        if not 0 <= rank < world:
            raise InputError(f"rank must be in [0, {world - 1}] for a world of {world}, got {rank}")
        return rank, local, world

    def _serve(self, host: str, port: int) -> Any:
        from gpufleet.runtime.monitor.exporter import ExporterConfig, serve

        return serve(ExporterConfig(host=host, port=port), self.registry)

    def _hung(self, report: HangReport) -> None:
        self.metrics.hang.set(1)
        LOG.error("hang: rank %d made no progress for %.1f s; stacks in %s", report.rank,
                  report.seconds_without_progress, report.stack_file)

    # ---- the loop's context managers -------------------------------------------------------------------------
    @contextmanager
    def step(self, tokens: int = 0) -> Iterator[None]:
        """One training step; `tokens` is how many tokens this rank processed in it."""
        if self.watchdog is not None and self.steps == 0:
            self.watchdog.beat()  # arm at the first step: start-up and compilation are not a hang
        self._step_compute_s = 0.0
        started = time.perf_counter()
        yield  # a step that raises is not recorded
        self.record_step(time.perf_counter() - started, tokens, self._step_compute_s or None)

    @contextmanager
    def compute(self) -> Iterator[None]:
        """The rank's own work inside a step (forward, backward), without waiting for other ranks: what straggler
        scores compare. Without it they compare whole steps, which collectives make equal across ranks."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self._step_compute_s += time.perf_counter() - started

    @contextmanager
    def data_wait(self) -> Iterator[None]:
        """Waiting for the next batch."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.metrics.data_wait.inc(time.perf_counter() - started)
            if self.watchdog is not None and self.steps:
                self.watchdog.beat()

    @contextmanager
    def checkpoint(self) -> Iterator[None]:
        """A checkpoint save: its stall is counted, and the hang watchdog pauses meanwhile."""
        if self.watchdog is not None:
            self.watchdog.pause()
        started = time.perf_counter()
        try:
            yield
        finally:
            self.metrics.checkpoint_stall.inc(time.perf_counter() - started)
            self.metrics.last_checkpoint.set(time.time())
            if self.watchdog is not None:
                self.watchdog.beat()

    # ---- bookkeeping -----------------------------------------------------------------------------------------
    def record_step(self, step_s: float, tokens: int = 0, compute_s: float | None = None) -> None:
        """Record one step timed by the caller (CUDA events, a framework's timer); `step()` calls this."""
        metrics = self.metrics
        self.steps += 1
        metrics.steps.inc()
        metrics.step_seconds.observe(step_s)
        metrics.last_step.set(time.time())
        if tokens:
            metrics.tokens.inc(tokens)
        self._steps_s.append(step_s)
        self._tokens.append(tokens)
        if compute_s:
            self._compute_s.append(compute_s)
        if self.watchdog is not None:
            self.watchdog.beat()
        if self.steps % self.straggler_every == 0:
            self._update_window()
            if self.world_size > 1 and self._group_ready():
                self.check_stragglers()

    def summary(self) -> StepSummary:
        """Medians of the last window of steps, and how they compare with the plan."""
        if not self._steps_s:
            raise InputError("no steps recorded yet: run a step under `with monitor.step(...)` first")
        step_s = statistics.median(self._steps_s)
        compute_s = statistics.median(self._compute_s) if self._compute_s else None
        tokens = sum(self._tokens) / sum(self._steps_s) if any(self._tokens) else None
        plan_ratio = None if self.plan is None else self.plan.step_s / step_s
        mfu = None
        if tokens is not None and self.flops_per_token and self.peak_flops_per_s:
            mfu = tokens * self.flops_per_token / self.peak_flops_per_s
        elif self.plan is not None:  # MFU scales with throughput for the same model on the same GPU
            mfu = self.plan.mfu * (tokens / self.plan.tokens_per_s_per_gpu if tokens is not None else plan_ratio or 0)
        return StepSummary(self.steps, step_s, compute_s, tokens, mfu, plan_ratio)

    def _update_window(self) -> None:
        summary = self.summary()
        metrics = self.metrics
        metrics.step_median.set(summary.step_s)
        if summary.tokens_per_s is not None:
            metrics.tokens_per_s.set(summary.tokens_per_s)
        if summary.mfu is not None:
            metrics.mfu.set(summary.mfu)
        if summary.plan_ratio is not None:
            metrics.plan_ratio.set(summary.plan_ratio)
        if self.rank == 0:
            LOG.info("rank 0: %s", summary.line())

    def _local_stats(self) -> straggler.RankStats:
        median = statistics.median(self._compute_s or self._steps_s)
        slowed, ratio = False, None
        if self.gpu_reader is not None:
            sample = self.gpu_reader.sample_clocks(self.gpu_index)
            slowed = sample.error is None and sample.slowed_down
            if sample.sm_clock_hz and sample.sm_clock_base_hz:
                ratio = sample.sm_clock_hz / sample.sm_clock_base_hz
        return straggler.RankStats(self.rank, median, slowed, ratio)

    def check_stragglers(self) -> straggler.StragglerReport:
        """Share this rank's median over the process group and score every rank (a collective: every rank calls it
        at the same step; StepMonitor does so every `straggler_every` steps)."""
        if self.hosts is None:
            self.hosts = self._gather_hosts()
        stats = straggler.exchange(self._local_stats(), self.group)
        report = straggler.score_ranks(stats, self.threshold)
        self.last_report = report
        self.metrics.score.set(report.scores[self.rank])
        self.metrics.straggler.set(float(self.rank in report.stragglers))
        if self.rank == 0:
            for line in straggler.describe(report, self.hosts):
                LOG.warning(line)
        return report

    def _group_ready(self) -> bool:
        """torch.distributed is installed and its process group is up (checked until it is, then remembered)."""
        if not self._group_up:
            try:
                import torch.distributed as dist
            except ImportError:
                return False
            self._group_up = dist.is_available() and dist.is_initialized()
        return self._group_up

    def _gather_hosts(self) -> list[str]:
        import torch.distributed as dist

        hosts: list[Any] = [None] * self.world_size
        dist.all_gather_object(hosts, self.hostname, group=self.group)
        return [str(h) for h in hosts]

    def close(self) -> None:
        """Stop the watchdog and the metrics server."""
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
