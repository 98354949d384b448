"""Monitoring: the node exporter (NVML, InfiniBand, checkpoint disk), StepMonitor for training loops, straggler
scoring over the process group, and the hang watchdog. Importing this package never imports torch."""
