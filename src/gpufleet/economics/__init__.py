"""Money and facilities: cloud offers, on-prem TCO, power, racks, cooling and the network bill of materials.

Pure functions over catalog records and frozen dataclasses; the only I/O is reading the catalog.
`run.run_economics` is the single entry point the planner uses.
"""
