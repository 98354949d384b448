"""`python -m gpufleet ...` (and `torchrun -m gpufleet ...`): the same command line as the `gpufleet` script."""

from gpufleet.cli.main import run

if __name__ == "__main__":
    run()
