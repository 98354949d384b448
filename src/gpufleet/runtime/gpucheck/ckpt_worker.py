"""The checkpoint step's child process (torch imported here only).

    python -m gpufleet.runtime.gpucheck.ckpt_worker save ROOT DEVICE MIB   # save asynchronously, forever
    python -m gpufleet.runtime.gpucheck.ckpt_worker load ROOT DEVICE MIB   # load the newest, verify, one JSON line

`save` prints `saving N` once checkpoint N is staged and its write runs in the background, and `durable N` once N
is committed; training goes on meanwhile (the state is changed in place after each save). The state is a pure
function of (step, device), so `load` can check every byte of what it got.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def expected_state(step: int, device: str, mib: int) -> dict[str, Any]:
    """About `mib` MiB of tensors on `device` (fp32, bf16, an int), every value a function of `step`."""
    import torch

    gen = torch.Generator(device=device).manual_seed(step)
    floats = mib * 2**20 // 8  # half the bytes fp32, the rest bf16 (twice as many values) and small tensors
    return {"model": {"w": torch.randn(floats, generator=gen, device=device),
                      "b": torch.full((1024,), float(step), dtype=torch.bfloat16, device=device)},
            "optim": {"m": torch.randn(floats * 2, generator=gen, device=device).to(torch.bfloat16),
                      "count": torch.tensor(step, device=device)},
            "step": step}


def same_state(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    return bool(a == b)


def save_forever(root: str, device: str, mib: int) -> None:
    from gpufleet.runtime.checkpoint import CheckpointManager

    manager = CheckpointManager(root, keep_last=2)
    durable, step = None, 0
    while True:
        state = expected_state(step, device, mib)
        manager.save(state, step)
        print(f"saving {step}", flush=True)
        state["model"]["w"].add_(1.0)  # training goes on while the save is written: the staged copy must not see it
        state["optim"]["count"].fill_(-1)
        if manager.last_committed_step != durable:
            durable = manager.last_committed_step
            print(f"durable {durable}", flush=True)
        step += 1


def load_and_verify(root: str, device: str, mib: int) -> dict[str, Any]:
    from gpufleet.runtime.checkpoint import CheckpointManager

    start = time.perf_counter()
    manager = CheckpointManager(root, keep_last=2)
    found = manager.load_latest(template=expected_state(0, device, mib))
    seconds = time.perf_counter() - start
    if found is None:
        return {"step": None, "same": False, "load_s": seconds}
    step, state = found
    return {"step": step, "same": same_state(state, expected_state(step, device, mib)), "load_s": seconds,
            "device": str(state["model"]["w"].device)}


def main(argv: list[str]) -> int:
    mode, root, device, mib = argv[0], argv[1], argv[2], int(argv[3])
    if device.startswith("cuda"):
        import torch

        torch.cuda.set_device(torch.device(device))
    if mode == "save":
        save_forever(root, device, mib)
        return 0
    print(json.dumps(load_and_verify(root, device, mib)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
