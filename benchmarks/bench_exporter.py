"""Exporter benchmark: the time one scrape of a node with 8 (fake) GPUs takes, as Prometheus sees it.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_exporter.py [--gpus 8] [--scrapes 200]

Starts the exporter's HTTP server on 127.0.0.1, GETs /metrics `--scrapes` times (after 5 warm-up scrapes) and
prints `name=value` lines: scrape_median_s (the target: <= 0.020 s for 8 GPUs), scrape_p90_s, and
collect_median_s (building the text in-process, without HTTP). Each scrape samples every GPU afresh through the
same NvmlReader code the real NVML path runs (18 NVLinks x 4 error counters per GPU included), with a thermal
throttle, ECC errors and an XID injected so that every family has series.
"""

from __future__ import annotations

import argparse
import statistics
import time
import urllib.request

from gpufleet.runtime.monitor.exporter import ExporterConfig, build_registry, open_reader, scrape, serve

TARGET_S = 0.020


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--scrapes", type=int, default=200)
    args = parser.parse_args()
    config = ExporterConfig(port=0, fake_gpus=args.gpus, fake_events=("1:hw_thermal", "2:ecc_corrected=3",
                                                                       "3:xid=79"))
    reader = open_reader(config)
    registry = build_registry(config, reader)
    server = serve(config, registry)
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    http_s, collect_s = [], []
    try:
        for i in range(args.scrapes + 5):
            started = time.perf_counter()
            with urllib.request.urlopen(url, timeout=10) as response:
                body = response.read()
            if i >= 5:
                http_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            scrape(registry)
            collect_s.append(time.perf_counter() - started)
    finally:
        server.shutdown()
    median = statistics.median(http_s)
    print(f"gpus={args.gpus}")
    print(f"series_bytes={len(body)}")
    print(f"scrape_median_s={median:.4f}")
    print(f"scrape_p90_s={statistics.quantiles(http_s, n=10)[-1]:.4f}")
    print(f"collect_median_s={statistics.median(collect_s):.4f}")
    print(f"target_s={TARGET_S}")
    print(f"meets_target={median <= TARGET_S}")


if __name__ == "__main__":
    main()
