"""Copy a state dict to host memory: the only part of an async save that stalls training.

Buffers are kept between saves and reused when the structure, shapes and dtypes match, so a steady
training loop allocates nothing after its first save. Host buffers are pinned when the source lives on
a GPU, so the device-to-host copies run at full PCIe/NVLink-C2C speed and can be issued non-blocking.
"""

from __future__ import annotations

import copy
from typing import Any

import torch


class HostStager:
    """Owns reusable host buffers; `stage(state_dict)` returns a detached host copy."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self._saw_gpu = False

    @property
    def buffer_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._buffers.values())

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        self._saw_gpu = False
        staged = self._copy(state_dict, "")
        if self._saw_gpu:
            torch.cuda.synchronize()
        return staged

    def _buffer(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        held = self._buffers.get(key)
        if held is None or held.shape != tensor.shape or held.dtype != tensor.dtype:
            pin = tensor.device.type == "cuda"
            held = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)
            self._buffers[key] = held
        if tensor.device.type != "cpu":
            self._saw_gpu = True
        held.copy_(tensor.detach(), non_blocking=tensor.device.type == "cuda")
        return held

    def _copy(self, value: Any, key: str) -> Any:
        from torch.distributed.tensor import DTensor

        if isinstance(value, DTensor):
            local = self._buffer(key, value.to_local())
            return DTensor.from_local(local, value.device_mesh, value.placements, run_check=False,
                                      shape=value.shape, stride=value.stride())
        if isinstance(value, torch.Tensor):
            return self._buffer(key, value)
        if isinstance(value, dict):
            return {k: self._copy(v, f"{key}/{k}") for k, v in value.items()}
        if isinstance(value, list | tuple):
            items = [self._copy(v, f"{key}/{i}") for i, v in enumerate(value)]
            return type(value)(items) if isinstance(value, tuple) else items
        return copy.deepcopy(value)
