"""Node preflight (`gpufleet doctor`) and the NCCL log reader (`gpufleet doctor nccl-log`).

Nothing here imports torch or changes the node it inspects: every probe reads a file under an injectable root or
asks an injectable command runner.
"""
