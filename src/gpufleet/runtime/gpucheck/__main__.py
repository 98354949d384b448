"""`python -m gpufleet.runtime.gpucheck` (what `scripts/gpu-check` runs)."""

from gpufleet.runtime.gpucheck.runner import main

raise SystemExit(main())
