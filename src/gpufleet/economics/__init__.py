"""Money and facilities: cloud offers, on-prem TCO, power, racks, cooling and the network bill of materials.

Pure functions over catalog records and frozen dataclasses; the only I/O is reading the catalog.
`run_economics.run_economics` is the single entry point the planner uses; `compare.compare_costs` is `gpufleet cost`'s.
"""
