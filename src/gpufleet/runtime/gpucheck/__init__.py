"""`scripts/gpu-check`: one command that runs every GPU path of gpufleet on one GPU (the NVML exporter against
nvidia-smi, the GEMM and memory benches against the catalog's peaks, a DCP checkpoint of device tensors killed
mid-save, the burn-in killed and resumed under NCCL, the plan-vs-measured loop, calibrate and plan) and writes
`gpu-check/REPORT.md` and `gpu-check/results.json`. Without a GPU it runs the same steps on the CPU where they exist
(its dry path) and marks the GPU-only ones skipped. docs/measure.md describes the steps and the report format.
"""
