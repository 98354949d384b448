"""What `gpufleet ckpt list|verify|prune|upload|download` ask, as typed requests, and the one call that answers each.

Each request owns its rules (a step in range, a positive cap and deadline, --keep-last at least 1) and each answer
is data: what was found, kept, deleted or copied, and, when the check the user asked for failed, `failure` (one
line) — the CLI prints it and picks the exit code. Deletion goes through `retention.delete_checkpoints`, the one
executor `CheckpointManager` uses too.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from pydantic import model_validator

from gpufleet.errors import InputError
from gpufleet.request import Request
from gpufleet.runtime.checkpoint.errors import CheckpointError, StoreUnreachableError
from gpufleet.runtime.checkpoint.names import MAX_STEP, join
from gpufleet.runtime.checkpoint.retention import RetentionPlan, delete_checkpoints, plan_retention
from gpufleet.runtime.checkpoint.store import (
    CheckpointInfo,
    TransferPolicy,
    bounded_storage_options,
    install_checkpoint,
    is_local,
    list_checkpoints,
    list_set_aside,
    open_url,
    store_errors,
    with_retries,
)
from gpufleet.runtime.checkpoint.verify import NOT_A_FOLDER, check_complete, verify_checkpoint
from gpufleet.runtime.store_deadline import DEFAULT_DEADLINE_S

URL_FORMS = "a folder, or a URL such as s3://bucket/prefix"


def open_root_url(where: str, deadline_s: float | None = None) -> tuple[Any, str]:
    """The file system and path of a root the user typed; refuses an empty path, a URL with no bucket and an
    in-memory store (it would vanish with this process). With `deadline_s`, one request to an S3 store never
    outlasts it (`store.bounded_storage_options`)."""
    if not where.strip():
        raise InputError(f"a checkpoint root is required ({URL_FORMS}), got an empty path")
    fs, root = open_url(where, bounded_storage_options(where, deadline_s) if deadline_s else None)
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    if "memory" in protocols:
        raise InputError(f"{where} is an in-memory store, which vanishes when this command exits: give {URL_FORMS}")
    if not root:
        if is_local(fs):
            raise InputError(f"a checkpoint root is required ({URL_FORMS}), got {where!r}")
        scheme = where.split("://", 1)[0]
        raise InputError(f"{where} names no bucket: a bucket is required, as in {scheme}://BUCKET or "
                         f"{scheme}://BUCKET/PREFIX")
    return fs, root


def open_root(where: str, deadline_s: float | None = None) -> tuple[Any, str]:
    """An existing folder of checkpoints (or store prefix)."""
    fs, root = open_root_url(where, deadline_s)
    if not fs.exists(root):
        raise CheckpointError(f"{where} does not exist")
    if not fs.isdir(root):
        raise CheckpointError(f"{where} is a file, not a folder of checkpoints ({URL_FORMS})")
    return fs, root


def open_destination(where: str, deadline_s: float | None = None) -> tuple[Any, str]:
    """A root to copy into: an existing folder, or one that can be created (on a local disk, created here)."""
    fs, root = open_root_url(where, deadline_s)
    if fs.exists(root) and not fs.isdir(root):
        raise CheckpointError(f"{where} is a file; the destination must be a folder (it is created if missing)")
    if is_local(fs):
        try:
            fs.makedirs(root, exist_ok=True)
        except OSError as error:
            raise CheckpointError(f"cannot create the destination folder {where}: {error.strerror or error}") from error
    return fs, root


def overlap(src_fs: Any, src_root: str, dst_fs: Any, dst_root: str) -> str | None:
    """How two roots overlap, or None: the same place, or one folder inside the other on this disk (links resolved;
    file:// URLs are local), or the same store URL."""
    if is_local(src_fs) != is_local(dst_fs):
        return None
    if is_local(src_fs):
        src_real, dst_real = os.path.realpath(src_root), os.path.realpath(dst_root)
        if src_real == dst_real:
            return "are the same place"
        common = os.path.commonpath([src_real, dst_real])
        if common == src_real:
            return "overlap: the destination is inside the source"
        if common == dst_real:
            return "overlap: the source is inside the destination"
        return None
    if src_fs.unstrip_protocol(src_root) == dst_fs.unstrip_protocol(dst_root):
        return "are the same place"
    return None


def _check_step(step: int | None) -> None:
    if step is not None and not 0 <= step <= MAX_STEP:
        raise InputError(f"--step must be an integer in [0, {MAX_STEP}], got {step}")


@dataclass(frozen=True)
class Answer:
    """A command's document (`data`, its --json output) and, when the check asked for failed, why (one line)."""

    data: dict[str, Any]
    failure: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class ListRequest(Request):
    """Every checkpoint under a root, checked complete (no checksums read), and what was set aside."""

    where: str


def _listed(fs: Any, info: CheckpointInfo) -> dict[str, Any]:
    """One `ckpt list` row: a checkpoint checked complete, or a file named like one (never read)."""
    if not info.is_folder:
        return {"step": info.step, "path": info.path, "complete": False, "size_bytes": None, "world_size": None,
                "problems": [NOT_A_FOLDER]}
    report = check_complete(fs, info.path)
    manifest = report.manifest
    return {"step": info.step, "path": info.path, "complete": report.ok,
            "size_bytes": manifest.total_bytes if manifest else None,
            "world_size": manifest.world_size if manifest else None, "problems": report.problems}


def list_root(request: ListRequest) -> Answer:
    """The rows of `ckpt list`; `extra["not_folders"]`: the files named like checkpoints."""
    where = request.where
    with store_errors(where):
        fs, root = open_root(where)
        infos = list_checkpoints(fs, root)
        rows = [_listed(fs, info) for info in infos]
        set_aside = list_set_aside(fs, root)
    return Answer({"root": where, "checkpoints": rows, "set_aside": set_aside},
                  extra={"not_folders": [info for info in infos if not info.is_folder]})


class VerifyRequest(Request):
    """Every file of every checkpoint under `where` (or of `step`) against its manifest."""

    where: str
    step: int | None = None

    @model_validator(mode="after")
    def _check(self) -> VerifyRequest:
        _check_step(self.step)
        return self


def verify_root(request: VerifyRequest) -> Answer:
    """Each checkpoint verified; leftovers (a store prefix without a manifest) reported apart; failure when one
    does not verify or none is there."""
    where, step = request.where, request.step
    with store_errors(where):
        fs, root = open_root(where)
        infos = list_checkpoints(fs, root)
        if step is not None:
            infos = [info for info in infos if info.step == step]
            if not infos:
                raise CheckpointError(f"no checkpoint step {step} in {where}")
        leftovers = [{"step": info.step, "path": info.path} for info in infos
                     if info.is_folder and not info.has_manifest and not is_local(fs)]
        infos = [info for info in infos if info.step not in {item["step"] for item in leftovers}]
        if not infos:
            found = f" (only {len(leftovers)} leftover(s) without a manifest)" if leftovers else " (no step_… folders)"
            return Answer({"root": where, "checkpoints": [], "leftovers": leftovers, "ok": False},
                          f"no checkpoints found in {where}{found}: nothing verified", {"none": True})
        results: list[dict[str, Any]] = []
        for info in infos:
            if not info.is_folder:
                results.append({"step": info.step, "path": info.path, "ok": False,
                                "problems": [f"{info.path}: {NOT_A_FOLDER}"]})
                continue
            report = verify_checkpoint(fs, info.path)
            results.append({"step": info.step, "path": info.path, "ok": report.ok,
                            "problems": [f"{join(info.path, p)}" for p in report.problems]})
    bad = [r for r in results if not r["ok"]]
    failure = (f"{len(bad)} of {len(results)} checkpoint(s) in {where} do not verify (steps "
               f"{', '.join(str(r['step']) for r in bad)})") if bad else None
    return Answer({"root": where, "checkpoints": results, "leftovers": leftovers, "ok": not bad}, failure)


class PruneRequest(Request):
    """Delete old complete checkpoints, keeping the newest `keep_last` that are whole (and multiples of
    `keep_every`); damaged ones are never deleted, those without a manifest only with `incomplete`."""

    where: str
    keep_last: int
    keep_every: int | None = None
    incomplete: bool = False
    checksums: bool = True
    dry_run: bool = False

    @model_validator(mode="after")
    def _check(self) -> PruneRequest:
        if self.keep_last < 1:
            raise InputError(f"--keep-last must be at least 1 (the newest complete checkpoint is never deleted), "
                             f"got {self.keep_last}")
        if self.keep_every is not None and self.keep_every < 1:
            raise InputError(f"--keep-every must be a positive number of steps (omit it to keep none extra), "
                             f"got {self.keep_every}")
        return self


def prune_root(request: PruneRequest) -> Answer:
    """What was (or would be) deleted, kept, left damaged or left as not a folder; failure when one could not
    be deleted (the others still are). `extra`: "doomed" {step: path}, "plan" the RetentionPlan."""
    where = request.where
    with store_errors(where):
        fs, root = open_root(where)
        infos = list_checkpoints(fs, root)
        checkpoints = [(info.step, info.path) for info in infos if info.is_folder]
        plan: RetentionPlan = plan_retention(fs, checkpoints, request.keep_last, request.keep_every,
                                             checksums=request.checksums)
        doomed = dict(plan.delete)
        if request.incomplete:
            doomed.update(plan.incomplete)
        doomed = dict(sorted(doomed.items()))
        failed = {} if request.dry_run else delete_checkpoints(fs, doomed)  # one that cannot go never stops the rest
        not_deleted = [{"step": step, "path": doomed.pop(step), "reason": why} for step, why in failed.items()]
    damaged: list[dict[str, Any]] = [{"step": step, "path": path, "problems": problems}
                                     for step, (path, problems) in plan.damaged.items()]
    not_folders = [{"step": info.step, "path": info.path} for info in infos if not info.is_folder]
    data = {"root": where, "dry_run": request.dry_run, "deleted": list(doomed.values()),
            "kept": list(plan.keep.values()), "damaged": damaged, "not_folders": not_folders,
            "not_deleted": not_deleted}
    failure = (f"{len(not_deleted)} checkpoint(s) could not be deleted: " + "; ".join(
        f"step {item['step']} ({item['path']}): {item['reason']}" for item in not_deleted)) if not_deleted else None
    return Answer(data, failure, {"doomed": doomed, "plan": plan})


class CopyRequest(Request):
    """Copy each complete, verified checkpoint (or `step`) from `source` to `destination`, a store retried for
    `deadline_s` seconds, optionally capped at `max_mib_per_s`."""

    source: str
    destination: str
    step: int | None = None
    max_mib_per_s: float | None = None
    deadline_s: float = DEFAULT_DEADLINE_S

    @model_validator(mode="after")
    def _check(self) -> CopyRequest:
        _check_step(self.step)
        if self.max_mib_per_s is not None and self.max_mib_per_s <= 0:
            raise InputError(f"--max-mib-per-s must be a positive number of MiB/s (omit it for no cap), "
                             f"got {self.max_mib_per_s:g}")
        if not self.deadline_s > 0:
            raise InputError(f"--deadline must be a positive number of seconds, got {self.deadline_s:g}")
        return self

    def policy(self) -> TransferPolicy:
        return TransferPolicy(max_bytes_per_s=None if self.max_mib_per_s is None else self.max_mib_per_s * 2**20,
                              max_attempts=None, deadline_s=self.deadline_s)


def copy_checkpoints(request: CopyRequest, verb: str) -> Answer:
    """Copy each complete step of the source into the destination; a store that does not answer within the
    deadline raises StoreUnreachableError (at any point: the steps already copied stay copied). Failure: none to
    copy, or steps not copied (a damaged source, a destination step refused)."""
    src, dst, step, policy = request.source, request.destination, request.step, request.policy()
    # each retry is logged as a warning; the outcome (one line, with the attempts) is what a user reads
    logging.getLogger("gpufleet.runtime.checkpoint").addHandler(logging.NullHandler())

    def reach(action: Any, url: str, what: str) -> Any:
        with store_errors(url):
            return with_retries(action, what, policy)

    src_fs, src_root = reach(lambda: open_root(src, policy.deadline_s), src, f"open {src}")
    found = reach(lambda: overlap(src_fs, src_root, *open_root_url(dst, policy.deadline_s)), dst, f"open {dst}")
    if found is not None:
        raise InputError(f"source and destination {found} ({src} and {dst}): give a destination root "
                         f"outside the source (and not containing it)")
    infos = [i for i in reach(lambda: list_checkpoints(src_fs, src_root), src, f"list {src}")
             if i.has_manifest and (step is None or i.step == step)]
    if step is not None and not infos:
        raise CheckpointError(f"no complete checkpoint step {step} in {src}")
    if not infos:
        return Answer({"from": src, "to": dst, "copied": [], "not_copied": []},
                      f"no complete checkpoints found in {src} (no step_… folder with a manifest): nothing {verb}",
                      {"none": True})
    dst_fs, dst_root = reach(lambda: open_destination(dst, policy.deadline_s), dst, f"open {dst}")
    copied: list[dict[str, Any]] = []
    not_copied: list[dict[str, Any]] = []  # a damaged source, or a destination step refused
    for info in infos:  # each step on its own: one bad step never stops the good ones after it
        target = join(dst_root, info.path.rstrip("/").rsplit("/", 1)[-1])
        report = reach(lambda info=info: verify_checkpoint(src_fs, info.path), src, f"verify {info.path}")
        if not report.ok:
            not_copied.append({"step": info.step, "reason": f"{info.path} does not verify: "
                               + "; ".join(report.problems)})
            continue
        try:
            with store_errors(f"{src} -> {dst}"):
                manifest, fresh = install_checkpoint(src_fs, info.path, dst_fs, target, policy)
        except StoreUnreachableError as error:  # every later step would wait out the deadline too: stop here
            done = ", ".join(str(item["step"]) for item in copied) or "none"
            raise StoreUnreachableError(f"{error} (steps copied before: {done})") from error
        except CheckpointError as error:
            not_copied.append({"step": info.step, "reason": str(error)})
            continue
        copied.append({"step": info.step, "to": target, "size_bytes": manifest.total_bytes, "copied": fresh})
    failure = (f"{len(not_copied)} checkpoint(s) not {verb}: " + "; ".join(
        f"step {item['step']}: {item['reason']}" for item in not_copied)) if not_copied else None
    return Answer({"from": src, "to": dst, "copied": copied, "not_copied": not_copied}, failure)
