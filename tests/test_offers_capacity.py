"""Capacity-aware cloud offers: an offer that does not sell a cluster of the plan's size is left out of the
cheapest-cloud answer, `--rank-by cost` and `cost`, and the output says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from clirun import run_gpufleet
from gpufleet.catalog.economics_records import CloudOffer
from gpufleet.catalog.registry import Catalog
from gpufleet.economics.cloud import skipped_for_size, split_by_size
from gpufleet.economics.run_economics import run_economics

DAY = 86400.0


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog()


def _offer(max_gpus: int | None, gpus_per_node: int = 8, usd: float = 2.0, beyond: str = "ask") -> CloudOffer:
    capacity = None if max_gpus is None else {"max_gpus": max_gpus, "beyond": beyond, "source": "test"}
    return CloudOffer.model_validate({"id": "x", "source": "test", "provider": "p", "sku": "s", "gpu": "h100-sxm",
                                      "pricing": "on-demand", "usd_per_gpu_hour": usd, "as_of": "2026",
                                      "gpus_per_node": gpus_per_node, "capacity": capacity})


def test_every_built_in_offer_says_how_large_a_cluster_it_sells(catalog: Catalog) -> None:
    for offer in catalog.records("cloud_offers").values():
        assert isinstance(offer, CloudOffer)
        assert offer.capacity is not None, offer.id
        if offer.capacity.judgement:  # a judgement call says so in its source, with the reason
            assert offer.capacity.source.startswith("judgement"), offer.id
        else:
            assert "docs." in offer.capacity.source or "http" in offer.capacity.source, offer.id


def test_the_size_check_counts_whole_instances() -> None:
    offer = _offer(64)
    assert skipped_for_size(offer, 64) is None
    skipped = skipped_for_size(offer, 57)  # 57 GPUs are billed as 8 instances = 64 GPUs: still sold
    assert skipped is None
    skipped = skipped_for_size(offer, 65)  # 9 instances = 72 GPUs > 64
    assert skipped is not None and skipped.max_gpus == 64 and "quote" in skipped.reason
    assert "not sold" in (skipped_for_size(_offer(64, beyond="none"), 65) or skipped).reason
    assert skipped_for_size(_offer(None), 10**6) is None  # no stated limit: never checked


def test_split_keeps_order_and_names_every_left_out_offer(catalog: Catalog) -> None:
    offers = [o for o in catalog.records("cloud_offers").values() if isinstance(o, CloudOffer)]
    selling, skipped = split_by_size(offers, 4096)
    assert {o.id for o in selling} | {s.name for s in skipped} == {o.id for o in offers}
    assert all(o.capacity is None or o.capacity.max_gpus >= 4096 for o in selling)
    assert [o.id for o in selling] == [o.id for o in offers if o in selling]


def test_run_economics_leaves_out_offers_too_small_for_the_cluster(catalog: Catalog) -> None:
    node = catalog.node("dgx-h100")
    small = run_economics(catalog, node=node, gpus=8, train_time_s=DAY, checkpoint_bytes=1e11)
    assert "vast-h100-marketplace" in {o.name for o in small.offers}  # one 8-GPU host: sold
    big = run_economics(catalog, node=node, gpus=16384, train_time_s=30 * DAY, checkpoint_bytes=1e12)
    assert "vast-h100-marketplace" in {s.name for s in big.skipped_offers}
    limits = {o.id: o.capacity.max_gpus for o in catalog.records("cloud_offers").values()
              if isinstance(o, CloudOffer) and o.capacity is not None}
    assert all(limits[o.name] >= 16384 for o in big.offers)  # none of the built-in ones does
    assert big.cheapest_offer is None


def _cheap_small_offer(tmp_path: Path, capacity: dict[str, object] | None) -> Path:
    """A user offer far cheaper than every built-in H100 offer, optionally with a size limit."""
    entry: dict[str, object] = {"id": "tiny-cheap", "provider": "Tiny", "sku": "1x H100", "gpu": "h100-sxm",
                                "pricing": "marketplace", "usd_per_gpu_hour": 0.5, "gpus_per_node": 1,
                                "as_of": "2026-12-01", "source": "test quote"}
    if capacity is not None:
        entry["capacity"] = capacity
    path = tmp_path / f"offer-{capacity is not None}.yaml"
    path.write_text(yaml.safe_dump({"cloud_offers": [entry]}), encoding="utf-8")
    return path


@pytest.mark.timeout(300)
def test_rank_by_cost_skips_an_offer_that_cannot_supply_the_gpus_and_says_so(tmp_path: Path) -> None:
    args = ("plan", "-m", "llama3-8b", "-t", "1T", "-n", "64", "--rank-by", "cost", "--top", "2")
    unlimited = run_gpufleet(*args, "--json", "--catalog", str(_cheap_small_offer(tmp_path, None)))
    assert unlimited.returncode == 0, unlimited.stderr
    assert json.loads(unlimited.stdout)["plans"][0]["cost"]["offers"][0]["name"] == "tiny-cheap"
    limited_file = str(_cheap_small_offer(tmp_path, {"max_gpus": 8, "beyond": "none", "source": "listing"}))
    limited = run_gpufleet(*args, "--json", "--catalog", limited_file)
    assert limited.returncode == 0, limited.stderr
    cost = json.loads(limited.stdout)["plans"][0]["cost"]
    assert "tiny-cheap" not in {o["name"] for o in cost["offers"]}
    assert {"name": "tiny-cheap", "max_gpus": 8, "beyond": "none"}.items() <= next(
        o for o in cost["skipped_offers"] if o["name"] == "tiny-cheap").items()
    table = run_gpufleet(*args, "--catalog", limited_file)
    assert table.returncode == 0, table.stderr
    rows = [line for line in table.stdout.splitlines() if line.startswith("│ 1 ")]
    assert rows and "tiny-cheap" not in rows[0]
    said = " ".join(table.stdout.split())
    assert "do not sell 64 GPUs at their listed price" in said and "tiny-cheap" in said


@pytest.mark.timeout(120)
def test_cost_checks_offers_against_the_cluster_size_it_is_given() -> None:
    sized = run_gpufleet("cost", "--gpu-hours", "1e6", "--gpus", "4096", "--json")
    assert sized.returncode == 0, sized.stderr
    data = json.loads(sized.stdout)
    left_out = {o["name"] for o in data["skipped_offers"]}
    assert "vast-h100-marketplace" in left_out and "aws-p5-spot" in left_out
    assert not left_out & {o["name"] for o in data["offers"]}
    unsized = json.loads(run_gpufleet("cost", "--gpu-hours", "1e6", "--json").stdout)
    assert unsized["skipped_offers"] == []  # no cluster size given: nothing to check against
    assert "vast-h100-marketplace" in {o["name"] for o in unsized["offers"]}
