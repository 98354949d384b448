"""torch.distributed.checkpoint (DCP) with safe loading: no pickle code execution, ever.

DCP stores non-tensor values with `torch.save` and reads them back with `torch.load(weights_only=False)`,
and it unpickles its `.metadata` file with plain `pickle.load`. Here both go through restricted loaders:
values use `weights_only=True`, and the metadata unpickler admits only DCP's own record classes, torch
sizes and dtypes, and plain containers.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from gpufleet.runtime.checkpoint.errors import CheckpointError

_DCP_MODULES = ("torch.distributed.checkpoint.metadata",)
_ALLOWED = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint.filesystem", "_StoragePrefix"),
    ("torch", "Size"),
    ("torch._utils", "_get_layout"),
    ("torch.serialization", "_get_layout"),
    ("torch", "layout"),
    ("torch", "memory_format"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "tuple"),
    ("builtins", "list"),
    ("builtins", "dict"),
    ("copyreg", "_reconstructor"),
    ("builtins", "object"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module in _DCP_MODULES or (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"checkpoint metadata refers to {module}.{name}, which is not allowed")


class SafeReader(dcp.FileSystemReader):
    """A FileSystemReader whose metadata unpickler only builds DCP's own records."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / ".metadata"
        try:
            with open(path, "rb") as handle:
                metadata = _MetadataUnpickler(handle).load()
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as error:
            raise CheckpointError(f"{path}: unreadable checkpoint metadata ({error})") from error
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{path}: not DCP metadata")
        storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
        storage_meta.load_id = self.load_id
        metadata.storage_meta = storage_meta
        return metadata


class _SafeBytesMixin:
    """Replaces DCP's `torch.load(weights_only=False)` for non-tensor values with weights-only loading."""

    flatten_state_dict: bool
    original_state_dict: dict[str, Any]
    state_dict: dict[str, Any]
    mappings: dict[str, Any]

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True, map_location="cpu")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


class SafeLoadPlanner(_SafeBytesMixin, DefaultLoadPlanner):
    """Loads into a template state dict (resharding to its layout)."""


class SafeEmptyPlanner(_SafeBytesMixin, _EmptyStateDictLoadPlanner):
    """Rebuilds the whole state dict from the checkpoint's metadata (one process)."""


def write(state_dict: dict[str, Any], path: Path, process_group: Any | None) -> None:
    """Each rank writes its shard into `path` (files fsynced); the coordinator writes `.metadata`."""
    import warnings

    writer = dcp.FileSystemWriter(path, single_file_per_rank=True, sync_files=True, thread_count=1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state_dict, storage_writer=writer, process_group=process_group,
                 no_dist=process_group is None)


def read(path: Path, template: dict[str, Any] | None, process_group: Any | None) -> dict[str, Any]:
    """Load a checkpoint; into `template` (resharding to its layout) or, without one, whole."""
    import warnings

    reader = SafeReader(path)
    no_dist = process_group is None
    if template is None:
        if not no_dist:
            raise CheckpointError("loading without a template needs a single process; pass a state dict "
                                  "shaped like this rank's model to load across ranks")
        state: dict[str, Any] = {}
        _load_state_dict(state, storage_reader=reader, planner=SafeEmptyPlanner(), no_dist=True)
        return state
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(template, storage_reader=reader, planner=SafeLoadPlanner(), process_group=process_group,
                 no_dist=no_dist)
    return template
