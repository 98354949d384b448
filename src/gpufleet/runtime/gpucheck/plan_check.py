"""The calibrate and plan steps: `calibrate --gpu G --from` every bench output the earlier steps wrote, then `plan`
for a dense and a MoE model on one node of G without and with `--calibration`, and what moved: the profile's fields,
each plan's step time, layout and the parts whose time changed."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpufleet.errors import InputError
from gpufleet.planfile import read_plan_file
from gpufleet.runtime.gpucheck import proc
from gpufleet.runtime.gpucheck.machine import Context
from gpufleet.runtime.gpucheck.results import Outcome

PROFILE_FIELDS = ("gemm_fraction_16bit", "gemm_fraction_fp8", "gemm_half_dim", "hbm_fraction", "host_s_per_kernel")
#: the plans compared: a dense and a MoE model on one 8-GPU node (the MoE plan carries the host term)
PLANS = (("llama3-8b", "1T"), ("mixtral-8x7b", "1T"))
PLAN_GPUS = 8
#: a part "moved" when its exposed time changed by more than this fraction
MOVED = 0.01


def calibrate_step(ctx: Context) -> Outcome:
    sources: list[Path] = [path for path in ctx.artifacts.get("calibrate_from", []) if path.exists()]
    if not sources:
        return Outcome("fail", "no bench output to calibrate from (the bench steps failed)")
    work = ctx.work("calibrate")
    profile = work / f"{ctx.gpu}.yaml"
    args = [arg for path in sources for arg in ("--from", str(path))]
    done = proc.run(proc.gpufleet("calibrate", "--gpu", ctx.gpu, *args, "--out", str(profile), "--json"), work,
                    ctx.env, ctx.left_s(), "calibrate")
    data = proc.json_document(done.stdout)
    ctx.artifacts["profile"] = profile
    fields = {name: {"built_in": data["built_in"].get(name), "measured": data["profile"].get(name)}
              for name in PROFILE_FIELDS if data["profile"].get(name) is not None}
    moved = [name for name, pair in fields.items() if pair["built_in"] != pair["measured"]]
    numbers = {"profile": str(profile), "from": [f"{path.parent.name}/{path.name}" for path in sources], **fields}
    return Outcome("pass", f"profile for {ctx.gpu} from {len(sources)} bench outputs; fields that moved: "
                   + (", ".join(moved) or "none"), numbers)


def _plan(ctx: Context, model: str, tokens: str, calibration: Path | None, work: Path) -> dict[str, Any]:
    extra = [] if calibration is None else ["--calibration", str(calibration)]
    name = f"plan-{model}-{'calibrated' if calibration else 'built-in'}"
    done = proc.run(proc.gpufleet("plan", "-m", model, "-t", tokens, "-g", ctx.gpu, "-n", str(PLAN_GPUS), *extra,
                                  "--json"), work, ctx.env, ctx.left_s(), name)
    try:
        plans = read_plan_file(proc.json_document(done.stdout), name).plans
    except InputError as error:
        raise proc.StepFailed(str(error)) from None
    if not plans:
        raise proc.StepFailed(f"plan for {model} on {PLAN_GPUS} x {ctx.gpu} found no layout")
    return plans[0].model_dump()


def what_moved(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The step time, layout and each part's exposed seconds that changed by more than MOVED."""
    parts = {}
    for name in sorted(set(before["parts"]) | set(after["parts"])):
        old = before["parts"].get(name, {}).get("exposed_s", 0.0)
        new = after["parts"].get(name, {}).get("exposed_s", 0.0)
        if abs(new - old) > MOVED * max(abs(old), 1e-12):
            parts[name] = {"built_in_s": old, "calibrated_s": new}
    return {"step_s": {"built_in": before["step_s"], "calibrated": after["step_s"]},
            "step_ratio": after["step_s"] / before["step_s"],
            "layout": {"built_in": before["layout"]["label"], "calibrated": after["layout"]["label"]},
            "mfu": {"built_in": before["mfu"], "calibrated": after["mfu"]}, "parts_moved": parts}


def plan_step(ctx: Context) -> Outcome:
    profile = ctx.artifacts.get("profile")
    if profile is None:
        return Outcome("fail", "no calibration profile (the calibrate step failed)")
    work = ctx.work("plan")
    numbers: dict[str, Any] = {}
    for model, tokens in PLANS:
        before = _plan(ctx, model, tokens, None, work)
        after = _plan(ctx, model, tokens, profile, work)
        numbers[model] = what_moved(before, after)
    summary = "; ".join(f"{model} step x{moved['step_ratio']:.3g} ({', '.join(moved['parts_moved']) or 'no part'} "
                        "moved)" for model, moved in numbers.items())
    return Outcome("pass", f"{PLAN_GPUS} x {ctx.gpu} with the measured profile: {summary}", numbers)
