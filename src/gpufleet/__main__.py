"""`python -m gpufleet ...` (what `torchrun -m gpufleet bench collectives` runs): the same CLI as `gpufleet`."""

from gpufleet.cli.main import run

if __name__ == "__main__":
    run()
