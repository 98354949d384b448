"""The `gpufleet bench ... --json` documents: one schema per bench, told apart by `kind`, written by `bench` and
read by `calibrate --from` and the GPU check (a low module: pydantic only, so the runtime and the CLI both import
it). A reader gets a checked document or one line naming the field; a document written before `kind` existed is
recognised by the keys that only its bench writes (the one place that still looks at keys)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from gpufleet.errors import InputError, describe_validation_error

_Record = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]


class GemmRow(BaseModel):
    model_config = _Record
    shape: str
    m: int = Field(ge=1)
    n: int = Field(ge=1)
    k: int = Field(ge=1)
    dtype: str
    time_s: Positive
    tflops: Positive
    peak_tflops: Positive | None = None
    fraction_of_peak: Positive | None = None
    device: str


class GemmBench(BaseModel):
    """`bench gemm`: achieved FLOP/s of a model's GEMMs."""

    model_config = _Record
    kind: Literal["gemm"] = "gemm"
    model: str
    tokens: int = Field(ge=1)
    tp: int = Field(ge=1)
    gpu: str | None = None
    rows: list[GemmRow] = Field(min_length=1)


class MemoryBench(BaseModel):
    """`bench memory`: copy bandwidth of the device's memory."""

    model_config = _Record
    kind: Literal["memory"] = "memory"
    size_bytes: int = Field(ge=1)
    time_s: Positive
    bandwidth_gbps: Positive
    peak_gbps: Positive | None = None
    fraction_of_peak: Positive | None = None
    device: str


class CollectiveRow(BaseModel):
    model_config = _Record
    collective: str
    size_bytes: int = Field(ge=1)
    time_s: Positive
    algbw_gbps: NonNegative
    busbw_gbps: NonNegative
    expected_busbw_gbps: NonNegative | None = None
    shortfall: bool | None = None
    ranks: int = Field(ge=1)
    ranks_per_node: int | None = Field(default=None, ge=1)


class CollectivesBench(BaseModel):
    """`bench collectives`: bus bandwidth per collective and size."""

    model_config = _Record
    kind: Literal["collectives"] = "collectives"
    ranks: int = Field(ge=1)
    backend: str
    rows: list[CollectiveRow] = Field(min_length=1)


class DiskRow(BaseModel):
    model_config = _Record
    size_bytes: int = Field(ge=1)
    write_s: Positive
    write_gbps: Positive
    read_s: Positive
    read_gbps: Positive


class DiskBench(BaseModel):
    """`bench disk`: sequential write (with fsync) and read at checkpoint-file sizes."""

    model_config = _Record
    kind: Literal["disk"] = "disk"
    path: str
    rows: list[DiskRow] = Field(min_length=1)


class HostOp(BaseModel):
    model_config = _Record
    host_s_per_kernel: Positive
    device_s_per_kernel: Positive
    device_kernels_per_s: Positive
    repeats_s: list[Positive]


class HostBench(BaseModel):
    """`bench host`: host seconds per launched op (the MoE step model's host_s_per_kernel)."""

    model_config = _Record
    kind: Literal["host"] = "host"
    host_s_per_kernel: Positive
    by_op: dict[str, HostOp] = Field(min_length=1)
    device: str
    repeats: int = Field(ge=1)
    iters: int = Field(ge=1)
    autograd: bool


BenchResult = Annotated[GemmBench | MemoryBench | CollectivesBench | DiskBench | HostBench,
                        Field(discriminator="kind")]
_ADAPTER: TypeAdapter[Any] = TypeAdapter(BenchResult)
KINDS = ("gemm", "memory", "collectives", "disk", "host")


def _written_before_kind(data: dict[str, Any]) -> str | None:
    """The bench that wrote a document without `kind`, from the keys only it writes (None: none of them)."""
    if "host_s_per_kernel" in data and "by_op" in data:
        return "host"
    if "bandwidth_gbps" in data:
        return "memory"
    rows = data.get("rows")
    first = rows[0] if isinstance(rows, list) and rows and isinstance(rows[0], dict) else {}
    for kind, key in (("gemm", "tflops"), ("collectives", "busbw_gbps"), ("disk", "write_gbps")):
        if key in first:
            return kind
    return None


def read_bench_result(data: Any, where: str) -> GemmBench | MemoryBench | CollectivesBench | DiskBench | HostBench:
    """A bench document, checked; one InputError line naming `where` and the field otherwise."""
    if not isinstance(data, dict):
        raise InputError(f"{where} is not the --json output of a gpufleet bench (a JSON object)")
    kind = data.get("kind") or _written_before_kind(data)
    if kind not in KINDS:
        raise InputError(f"{where} is not the --json output of bench {', '.join(KINDS[:-1])} or {KINDS[-1]}")
    try:
        return _ADAPTER.validate_python({**data, "kind": kind})
    except ValidationError as error:
        raise InputError(f"{where}: a {kind} bench result {describe_validation_error(error)}") from None
