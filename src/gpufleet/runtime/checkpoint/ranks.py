"""The ranks one CheckpointManager spans, and the few collectives its save and load protocols need.

In one process (no process group given, none initialised) every collective is a no-op. With several ranks two side
groups on gloo are created: `io_group`, used only by the background writer, and `ctl_group`, used only by the
caller's thread (skip decisions, load coordination), so collectives of the two threads never interleave on one group.
torch is imported only when a collective runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ranks:
    """This process's rank among `world_size`, and the two side groups (None in one process)."""

    rank: int = 0
    world_size: int = 1
    io_group: Any = None
    ctl_group: Any = None

    @classmethod
    def join(cls, process_group: Any | None) -> Ranks:
        """The ranks of `process_group` (None: the default group, if torch.distributed is initialised; else one
        process), with their two side groups created."""
        import torch.distributed as dist

        if process_group is None and not (dist.is_available() and dist.is_initialized()):
            return cls()
        ranks = None if process_group is None else dist.get_process_group_ranks(process_group)
        return cls(rank=dist.get_rank(process_group), world_size=dist.get_world_size(process_group),
                   io_group=dist.new_group(ranks=ranks, backend="gloo"),
                   ctl_group=dist.new_group(ranks=ranks, backend="gloo"))

    @property
    def first(self) -> bool:
        """Whether this is rank 0, the one that commits, sweeps, retains and uploads."""
        return self.rank == 0

    def barrier(self, group: Any) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier(group=group)

    def gather(self, item: Any) -> list[Any] | None:
        """Every rank's `item` on rank 0 (on `io_group`), in rank order; None on the other ranks."""
        if self.world_size == 1:
            return [item]
        import torch.distributed as dist

        out: list[Any] | None = [None] * self.world_size if self.first else None
        dist.gather_object(item, out, dst=dist.get_global_rank(self.io_group, 0), group=self.io_group)
        return out

    def broadcast(self, item: Any, group: Any = None) -> Any:
        """Rank 0's `item` on every rank, over `group` (default `ctl_group`)."""
        if self.world_size == 1:
            return item
        import torch.distributed as dist

        group = group or self.ctl_group
        box = [item]
        dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
        return box[0]

    def any_rank(self, flag: bool) -> bool:
        """Whether `flag` is set on any rank (on `ctl_group`)."""
        if self.world_size == 1:
            return flag
        import torch
        import torch.distributed as dist

        value = torch.tensor([int(flag)])
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.ctl_group)
        return bool(value.item())
