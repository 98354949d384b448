"""The private torch APIs of the checkpoint code are in one module and still there in the installed torch: a torch
release that moves or changes one fails here, naming it, instead of deep inside a checkpoint load."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpufleet.runtime.checkpoint import torch_private  # noqa: E402

CHECKPOINT = Path(torch_private.__file__).parent


def test_every_private_torch_api_is_there_and_takes_what_gpufleet_passes() -> None:
    torch_private.check()


def test_a_changed_api_fails_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    changed = (*torch_private.PRIVATE_APIS,
               ("torch.distributed.checkpoint.state_dict_loader", "_load_state_dict", ("no_such_argument",), "x"),
               ("torch.distributed.checkpoint._traverse", "gone_in_a_later_torch", None, "y"))
    monkeypatch.setattr(torch_private, "PRIVATE_APIS", changed)
    with pytest.raises(ImportError) as raised:
        torch_private.check()
    message = str(raised.value)
    assert "state_dict_loader._load_state_dict no longer takes no_such_argument" in message
    assert "torch.distributed.checkpoint._traverse.gone_in_a_later_torch is gone" in message


def test_no_other_checkpoint_module_imports_a_private_torch_name() -> None:
    for path in sorted(CHECKPOINT.glob("*.py")):
        if path.name == "torch_private.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert "._" not in (node.module or "") and not private, f"{path.name}: {node.module} {private}"
