"""A checkpoint that saves must load: NumPy values and RNG states round-trip exactly through a kill and a fresh
process, and anything the weights-only loader would refuse is refused by save(), naming the key.

Before the fix, `save({"rng": np.random.get_state()})` succeeded and verified, and every later load raised
torch's raw CheckpointException (the weights-only refusal): a job keeping NumPy's RNG state could never resume.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from gpufleet.runtime.checkpoint import CheckpointManager  # noqa: E402
from gpufleet.runtime.checkpoint.errors import UnloadableValueError  # noqa: E402

pytestmark = [pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def torch_default_safe_globals() -> Any:
    """Each test starts from torch's own list of classes the safe loader admits: a library imported earlier in the
    same process (megatron-core admits argparse.Namespace on import) must not decide what these tests see."""
    saved = list(torch.serialization.get_safe_globals())
    torchs_own = [entry for entry in saved if str(getattr(entry, "__module__", "")).startswith("torch.")]
    torch.serialization.clear_safe_globals()
    torch.serialization.add_safe_globals(torchs_own)
    yield
    torch.serialization.clear_safe_globals()
    torch.serialization.add_safe_globals(saved)
SRC = Path(__file__).parents[2] / "src"

SAVER = r'''
import json, random, sys, time
import numpy as np, torch
from gpufleet.runtime.checkpoint import CheckpointManager

root, draws_path = sys.argv[1], sys.argv[2]
random.seed(11); np.random.seed(12); torch.manual_seed(13)
gen = np.random.default_rng(14)
for _ in range(3):  # move every generator off its seed, and leave NumPy a cached Gaussian
    random.random(); np.random.standard_normal(); gen.random(); torch.rand(1)
state = {"w": torch.arange(6.0), "np_rng": np.random.get_state(), "py_rng": random.getstate(),
         "gen": gen.bit_generator.state, "torch_rng": torch.get_rng_state(),
         "np_scalar": np.float32(0.1), "np_int": np.int64(-7), "table": np.arange(12, dtype=np.uint16).reshape(3, 4),
         "names": np.array(["a", "bc"]), "when": np.array(["2024-01-01"], dtype="datetime64[D]")}
CheckpointManager(root).save(state, 5, blocking=True)
draws = {"py": [random.random() for _ in range(5)], "np": np.random.standard_normal(5).tolist(),
         "np_u32": np.random.randint(0, 2**32, 5, dtype=np.uint64).tolist(), "gen": gen.random(5).tolist(),
         "torch": torch.rand(5).tolist()}
with open(draws_path, "w") as out:
    json.dump(draws, out)
print("saved", flush=True)
time.sleep(600)
'''

RESUMER = r'''
import json, random, sys
import numpy as np, torch
from gpufleet.runtime.checkpoint import CheckpointManager

root = sys.argv[1]
step, state = CheckpointManager(root).load_latest()
random.setstate(state["py_rng"]); np.random.set_state(state["np_rng"]); torch.set_rng_state(state["torch_rng"])
gen = np.random.default_rng(0)
gen.bit_generator.state = state["gen"]
draws = {"py": [random.random() for _ in range(5)], "np": np.random.standard_normal(5).tolist(),
         "np_u32": np.random.randint(0, 2**32, 5, dtype=np.uint64).tolist(), "gen": gen.random(5).tolist(),
         "torch": torch.rand(5).tolist()}
kinds = {key: [type(state[key]).__name__, str(getattr(state[key], "dtype", ""))]
         for key in ("np_scalar", "np_int", "table", "names", "when")}
print(json.dumps({"step": step, "draws": draws, "kinds": kinds, "table": state["table"].tolist(),
                  "np_rng_0": state["np_rng"][0], "mt": state["np_rng"][1].dtype.str,
                  "py_rng_type": type(state["py_rng"]).__name__, "scalar": float(state["np_scalar"])}))
'''


def test_numpy_and_python_rng_states_round_trip_bit_for_bit_through_a_kill(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    root, draws_path = tmp_path / "ckpt", tmp_path / "draws.json"
    saver = subprocess.Popen([sys.executable, "-c", SAVER, str(root), str(draws_path)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert saver.stdout is not None
        assert saver.stdout.readline().strip() == "saved", saver.stderr.read() if saver.stderr else ""
    finally:
        saver.send_signal(signal.SIGKILL)  # no close(), no cleanup: what a crash leaves
        saver.communicate()
    expected = json.loads(draws_path.read_text())
    resumed = subprocess.run([sys.executable, "-c", RESUMER, str(root)], capture_output=True, text=True, env=env,
                             timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    got = json.loads(resumed.stdout)
    assert got["step"] == 5
    assert got["draws"] == expected  # every generator continues exactly where the killed process was
    assert got["kinds"] == {"np_scalar": ["float32", "float32"], "np_int": ["int64", "int64"],
                            "table": ["ndarray", "uint16"], "names": ["ndarray", "<U2"],
                            "when": ["ndarray", "datetime64[D]"]}
    assert got["table"] == np.arange(12).reshape(3, 4).tolist() and got["scalar"] == float(np.float32(0.1))
    assert got["np_rng_0"] == "MT19937" and got["mt"] == "<u4" and got["py_rng_type"] == "tuple"


def test_numpy_values_load_into_a_template_too(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    rng = np.random.RandomState(3)
    manager.save({"rng": rng.get_state(), "x": np.linspace(0, 1, 7)}, 1, blocking=True)
    template = {"rng": np.random.RandomState(99).get_state(), "x": np.zeros(7)}
    loaded = manager.load(1, template)
    assert np.array_equal(loaded["rng"][1], rng.get_state()[1]) and np.array_equal(loaded["x"], np.linspace(0, 1, 7))
    manager.close()


REFUSED = {
    "args": (argparse.Namespace(lr=0.1), "vars(args)"),
    "started": (datetime.datetime(2026, 1, 2, 3, 4, 5), "isoformat"),
    "lock": (threading.Lock(), "cannot be pickled"),
    "path": (Path("/data"), "str(path)"),
}


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_save_refuses_what_loading_would_refuse_naming_the_key(tmp_path: Path, key: str) -> None:
    value, advice = REFUSED[key]
    manager = CheckpointManager(tmp_path)
    state: dict[str, Any] = {"model": {"w": torch.ones(3)}, "extra": {"run": [1, {key: value}]}}
    with pytest.raises(UnloadableValueError) as refused:
        manager.save(state, 1, blocking=True)
    assert refused.value.key == f"extra.run[1].{key}"
    assert f"'extra.run[1].{key}'" in str(refused.value) and advice in str(refused.value), str(refused.value)
    assert "weights_only=False" not in str(refused.value)  # never advise turning the safe loader off
    assert not [p for p in tmp_path.iterdir() if p.name != "latest"]  # nothing written, not even a temporary
    manager.save({"model": {"w": torch.ones(3)}}, 2, blocking=True)  # the manager is still usable
    assert manager.steps() == [2]
    manager.close()


def test_a_class_admitted_by_the_caller_is_accepted(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    with torch.serialization.safe_globals([argparse.Namespace]):
        manager.save({"args": argparse.Namespace(lr=0.1)}, 1, blocking=True)
        loaded = manager.load(1)
    assert loaded["args"] == argparse.Namespace(lr=0.1)
    manager.close()
