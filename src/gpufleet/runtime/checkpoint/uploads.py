"""Background uploads of committed checkpoints, retried until they land or retention supersedes them.

One thread copies queued steps to the store, oldest request first. A step whose copy fails after its per-file
retries (`TransferPolicy.max_attempts`: an outage longer than those) is not dropped: it is kept as failed and
queued again by later saves once its backoff has passed (`retry_after_s`, doubling up to `retry_max_s`), and
tried again at `close()` until it lands or `close()`'s deadline passes. A step deleted locally by retention is
superseded: it is forgotten, never retried. A refusal (the store holds a different checkpoint of that step, or
the local copy is damaged) is reported and not retried: trying again cannot change it; `close()` names it among
the steps that never reached the store.

Nothing here writes locally; a crash at any point leaves the local checkpoints as they were and the store with
whole checkpoints plus at most one prefix without a manifest (never listed complete; a later upload completes it).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpufleet.runtime.checkpoint.errors import CheckpointError, TransferError

log = logging.getLogger(__name__)


@dataclass
class _Failed:
    attempts: int
    due_s: float
    """`time.monotonic()` after which the step may be tried again."""
    error: str


class Uploader:
    """Owns the upload thread; `upload(step)` does one copy and returns False when the step is gone locally."""

    def __init__(self, upload: Callable[[int], bool], *, retry_after_s: float, retry_max_s: float) -> None:
        self._upload = upload
        self.retry_after_s = retry_after_s
        self.retry_max_s = retry_max_s
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._lock = threading.Lock()
        self._queued: set[int] = set()
        self._failed: dict[int, _Failed] = {}
        self._refused: dict[int, str] = {}  # steps refused and not retried: never in the store, named by close()
        self._superseded: set[int] = set()  # steps retention deleted locally: whatever their upload met, not owed
        self._errors: list[str] = []
        self.uploaded: set[int] = set()
        self._thread = threading.Thread(target=self._loop, name="ckpt-upload", daemon=True)
        self._thread.start()

    # -- called by the manager ---------------------------------------------------------------------------

    def submit(self, step: int) -> None:
        """Queue `step` (just committed), and every failed step whose backoff has passed."""
        self._put(step)
        self.retry_due()

    def retry_due(self) -> list[int]:
        """Queue the failed steps whose backoff has passed; returns them."""
        now = time.monotonic()
        with self._lock:
            due = sorted(step for step, failed in self._failed.items() if failed.due_s <= now)
        for step in due:
            self._put(step)
        return due

    def forget(self, step: int) -> None:
        """`step` was deleted locally (retention): superseded, never retried."""
        with self._lock:
            self._superseded.add(step)
            self._refused.pop(step, None)
            if self._failed.pop(step, None) is not None:
                log.info("upload of step %d superseded: retention deleted it locally", step)

    def in_flight(self) -> set[int]:
        """Steps queued or waiting to be tried again: their prefix in the store may be a copy still to be finished."""
        with self._lock:
            return self._queued | set(self._failed)

    @property
    def failed_steps(self) -> list[int]:
        with self._lock:
            return sorted(self._failed)

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until every queued upload has been tried; raise CheckpointError naming what failed since the last
        call (failed steps stay queued for retry)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if deadline is not None and time.monotonic() > deadline:
                raise CheckpointError(f"uploads still running after {timeout_s} s")
            time.sleep(0.02)
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            raise CheckpointError("; ".join(errors))

    def close(self, timeout_s: float | None) -> None:
        """Finish the queue, retry failed steps (backoff honoured) until none is left or `timeout_s` has passed,
        then stop the thread. Raises CheckpointError naming the steps that never reached the store."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            self._drain(deadline)
            while self.failed_steps and (deadline is None or time.monotonic() < deadline):
                self._sleep_until_due(deadline)
                self.retry_due()
                self._drain(deadline)
        finally:
            self._queue.put(None)
            self._thread.join(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()) + 5)
        with self._lock:
            left = {step: failed.error for step, failed in self._failed.items()} | self._refused
            left.update({step: "not tried before the deadline" for step in self._queued if step not in left})
            left = dict(sorted(left.items()))
        if left:
            raise CheckpointError(
                f"{len(left)} checkpoint(s) not in the store after {timeout_s} s of retries (steps "
                f"{', '.join(map(str, left))}; last error: {list(left.values())[-1]}); they are intact on local "
                f"disk: copy them later with `gpufleet ckpt upload`")

    # -- the thread --------------------------------------------------------------------------------------

    def _put(self, step: int) -> None:
        with self._lock:
            if step in self._queued:
                return
            self._queued.add(step)
        self._queue.put(step)

    def _loop(self) -> None:
        while True:
            step = self._queue.get()
            try:
                if step is None:
                    return
                with self._lock:
                    self._queued.discard(step)
                self._try(step)
            finally:
                self._queue.task_done()

    def _try(self, step: int) -> None:
        try:
            present = self._upload(step)
        except TransferError as error:  # the store did not take it: retried later
            self._failure(step, str(error), retry=True)
            return
        except Exception as error:  # a refusal or local damage: retrying cannot change it
            self._failure(step, str(error), retry=False)
            return
        with self._lock:
            self._failed.pop(step, None)
            self._refused.pop(step, None)
            if present:
                self.uploaded.add(step)
        if not present:
            log.warning("step %d was deleted locally before its upload; skipped", step)

    def _failure(self, step: int, error: str, *, retry: bool) -> None:
        with self._lock:
            attempts = self._failed[step].attempts + 1 if step in self._failed else 1
            delay_s = min(self.retry_after_s * 2 ** (attempts - 1), self.retry_max_s)
            if retry:
                self._failed[step] = _Failed(attempts, time.monotonic() + delay_s, error)
            else:
                self._failed.pop(step, None)
                if step not in self._superseded:  # a copy cut off by retention's deletion is no refusal
                    self._refused[step] = error
            self._errors.append(f"upload of step {step}: {error}")
        if retry:
            log.error("upload of step %d failed (attempt %d; tried again after %.1f s, by a later save or close()): "
                      "%s", step, attempts, delay_s, error)
        else:
            log.error("upload of step %d refused, not retried: %s", step, error)

    def _drain(self, deadline: float | None) -> None:
        while self._queue.unfinished_tasks and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.02)

    def _sleep_until_due(self, deadline: float | None) -> None:
        with self._lock:
            due = min((failed.due_s for failed in self._failed.values()), default=time.monotonic())
        until = due if deadline is None else min(due, deadline)
        time.sleep(max(0.0, until - time.monotonic()))
