"""Economics against hand-derived numbers: fabric BOM, facility power and racks, TCO, cloud bills, runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.catalog.economics_records import CloudOffer, PurchasePrice
from gpufleet.catalog.registry import Catalog
from gpufleet.economics.cloud import billed_gpus, cost_of_gpu_hours, cost_of_job, offer, offers_for_gpu
from gpufleet.economics.defaults import facility_defaults
from gpufleet.economics.facility import estimate_facility, node_power_w
from gpufleet.economics.network import fat_tree_bom
from gpufleet.economics.run_economics import RunEconomics, run_economics
from gpufleet.economics.tco import Capex, OnPremTco, onprem_tco
from gpufleet.errors import CatalogError, InputError, UnknownNameError

DAY = 86400.0


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog()


# ---- network bill of materials ---------------------------------------------------------------------

def test_fat_tree_matches_superpod_ra() -> None:
    # DGX SuperPOD H100 RA: 4 SU = 1,016 GPUs -> 32 leaf + 16 spine; 16 SU = 4,096 -> 128 + 128 + 64 core
    four_su = fat_tree_bom(1016, 64)
    assert (four_su.tiers, four_su.leaf_switches, four_su.spine_switches) == (2, 32, 16)
    sixteen_su = fat_tree_bom(4096, 64)
    assert (sixteen_su.leaf_switches, sixteen_su.spine_switches, sixteen_su.core_switches) == (128, 128, 64)


def test_fat_tree_limits() -> None:
    # two tiers hold k^2/2 endpoints with 3k/2 switches; three tiers k^3/4 with 5k^2/4 (Al-Fares 2008)
    assert fat_tree_bom(2048, 64).switches == 96
    assert fat_tree_bom(65536, 64).switches == 5 * 64 * 64 // 4
    assert fat_tree_bom(40, 64).switches == 1
    with pytest.raises(InputError, match="exceed a three-tier"):
        fat_tree_bom(65537, 64)


# ---- facility --------------------------------------------------------------------------------------

def test_facility_512_h100_by_hand(catalog: Catalog) -> None:
    node, defaults = catalog.node("dgx-h100"), facility_defaults(catalog)
    est = estimate_facility(node, 512, defaults, catalog.network("ndr400"))
    # 64 nodes x 10.2 kW = 652.8 kW; 512 NIC ports -> 16 leaf + 8 spine = 24 switches x 1 kW;
    # storage 512 TB x 8 W/TB = 4,096 W
    assert est.nodes == 64
    assert est.fabric.switches == 24
    assert est.it_power_max_w == pytest.approx(652_800 + 24_000 + 4_096)
    assert est.it_power_typical_w == pytest.approx(64 * 7_000 + 24_000 + 4_096)
    # 40 kW // 10.2 kW = 3 nodes by power, 36U // 8U = 4 by space -> 3 per rack, ceil(64/3) = 22 racks
    assert (est.nodes_per_rack_by_power, est.nodes_per_rack_by_units, est.racks) == (3, 4, 22)
    assert est.rack_w == pytest.approx(30_600)
    assert est.cooling == "rear-door"  # 30.6 kW: above the 30 kW air limit, within 40 kW rear-door
    assert est.facility_power_w == pytest.approx(680_896 * 1.3)
    assert est.annual_energy_kwh == pytest.approx(476_096 * 1.3 * 8760 / 1000)
    assert est.annual_energy_usd == pytest.approx(476_096 * 1.3 * 8760 / 1000 * 0.08)


def test_cooling_tiers_follow_rack_power(catalog: Catalog) -> None:
    node = catalog.node("dgx-h100")
    air = facility_defaults(catalog, rack_kw=25)
    liquid = facility_defaults(catalog, rack_kw=60)
    assert estimate_facility(node, 64, air).cooling == "air"  # 2 nodes, 20.4 kW
    # 4 nodes (by space), 40.8 kW: NVIDIA's air-cooled reference rack, rear-door heat exchangers (limit 56 kW)
    assert estimate_facility(node, 64, liquid).cooling == "rear-door"
    denser = facility_defaults(catalog, rack_kw=60, rear_door_max_kw_per_rack=40)
    assert estimate_facility(node, 64, denser).cooling == "direct-liquid"  # above a site's own 40 kW door limit


def test_node_power_interpolates_with_mfu(catalog: Catalog) -> None:
    node, defaults = catalog.node("dgx-h100"), facility_defaults(catalog)
    # idle 0.3 x 10.2 kW = 3,060 W; typical 7,000 W at MFU 0.5
    assert node_power_w(node, defaults) == 7_000
    assert node_power_w(node, defaults, 0.5) == pytest.approx(7_000)
    assert node_power_w(node, defaults, 0.25) == pytest.approx(3_060 + 3_940 * 0.5)
    assert node_power_w(node, defaults, 1.0) == 10_200  # capped at the PSU maximum


def test_facility_rejects_node_bigger_than_rack(catalog: Catalog) -> None:
    with pytest.raises(InputError, match="raise the rack's power"):
        estimate_facility(catalog.node("dgx-h100"), 8, facility_defaults(catalog, rack_kw=8))


def test_a_rack_scale_node_is_its_own_rack(catalog: Catalog) -> None:
    # GB200 NVL72 ships as one 120 kW liquid-cooled rack: the DGX GB200 SuperPOD RA's scalable unit is 8 racks =
    # 8 NVL72 = 576 GPUs. It is not packed into the facility's 40 kW / 36U racks (which would refuse it).
    node, defaults = catalog.node("gb200-nvl72"), facility_defaults(catalog)
    assert node.rack_scale and node.max_power_w > defaults.rack_w and node.rack_units > defaults.rack_units_usable
    est = estimate_facility(node, 576, defaults, catalog.network("ndr400"))
    assert (est.nodes, est.racks, est.nodes_per_rack) == (8, 8, 1)
    assert est.rack_w == 120_000 and est.cooling == "direct-liquid"
    assert est.nodes_w_max == 8 * 120_000


def test_override_is_validated(catalog: Catalog) -> None:
    with pytest.raises(InputError, match="pue"):
        facility_defaults(catalog, pue=0.5)


# ---- TCO -------------------------------------------------------------------------------------------

def _simple_tco(energy_busy: float = 0.0) -> OnPremTco:
    return OnPremTco(gpus=8, capex=Capex(300_000, 0, 0, 0, 0), amortization_years=3, staff_usd_per_year=0,
                     maintenance_usd_per_year=0, colocation_usd_per_year=0, energy_usd_per_year_idle=0,
                     energy_usd_per_year_busy=energy_busy)


def test_tco_by_hand() -> None:
    tco = _simple_tco()
    # $100k/year over 8 x 8,760 GPU-hours = $1.4269/GPU-h at full use, twice that at 50%
    assert tco.usd_per_gpu_hour(1.0) == pytest.approx(100_000 / (8 * 8760))
    assert tco.usd_per_gpu_hour(0.5) == pytest.approx(2 * 100_000 / (8 * 8760))
    # against $2/GPU-h: u = 100,000 / (2 x 8 x 8,760) = 0.7135
    assert tco.breakeven_utilization(2.0) == pytest.approx(0.71347, abs=1e-5)
    # capex repaid by $2 x 8 x 730 = $11,680/month of cloud bills not paid: 25.68 months
    assert tco.breakeven_months(2.0, 1.0) == pytest.approx(300_000 / 11_680)
    assert tco.breakeven_utilization(1.0) is None  # would need u = 1.43
    assert _simple_tco(energy_busy=8_760.0).breakeven_months(0.0001, 1.0) is None  # opex > cloud bill


def test_tco_energy_scales_with_utilization() -> None:
    tco = _simple_tco(energy_busy=8_760.0)
    assert tco.annual_usd(0.5) == pytest.approx(100_000 + 4_380)
    # u = 100,000 / (2 x 8 x 8,760 - 8,760) = 0.7610
    assert tco.breakeven_utilization(2.0) == pytest.approx(100_000 / (2 * 8 * 8760 - 8760))


def test_tco_bad_inputs() -> None:
    with pytest.raises(InputError, match="utilization"):
        _simple_tco().usd_per_gpu_hour(1.5)
    with pytest.raises(InputError, match="price"):
        _simple_tco().breakeven_utilization(-1.0)


def test_onprem_capex_from_catalog(catalog: Catalog) -> None:
    defaults = facility_defaults(catalog)
    tco = onprem_tco(catalog, catalog.node("dgx-h100"), 512, defaults, catalog.network("ndr400"))
    assert tco.capex.servers_usd == 64 * 310_000
    assert tco.capex.switches_usd == 24 * 43_000
    assert tco.capex.optics_usd == 2 * 512 * 750  # NIC-leaf + leaf-spine links
    assert tco.capex.storage_usd == 512 * 1_000
    assert tco.staff_usd_per_year == 4 * 300_000  # ceil(512 / 170) engineers
    assert tco.maintenance_usd_per_year == pytest.approx(0.08 * tco.capex.hardware_usd)
    assert 1.5 < tco.usd_per_gpu_hour(0.7) < 5.0


# ---- cloud -----------------------------------------------------------------------------------------

def test_cloud_bills_whole_instances(catalog: Catalog) -> None:
    p5 = offer(catalog, "aws-p5-on-demand")
    assert billed_gpus(12, p5) == 16
    assert cost_of_job(p5, 12, 10 * 3600).usd == pytest.approx(160 * 6.88)
    assert billed_gpus(12, offer(catalog, "vast-h100-marketplace")) == 12


def test_offers_sorted_and_filtered(catalog: Catalog) -> None:
    h100 = offers_for_gpu(catalog, "h100-sxm")
    prices = [o.usd_per_gpu_hour for o in h100]
    assert prices == sorted(prices)
    assert {o.provider for o in h100} >= {"AWS", "GCP", "Azure", "CoreWeave", "Lambda", "Nebius", "Vast.ai"}
    assert all(o.pricing == "spot" for o in offers_for_gpu(catalog, "h100-sxm", ["spot"]))


def test_every_price_is_dated_and_sourced(catalog: Catalog) -> None:
    for record in catalog.records("cloud_offers").values():
        assert isinstance(record, CloudOffer) and record.as_of and record.source
    for record in catalog.records("purchase_prices").values():
        assert isinstance(record, PurchasePrice) and record.estimate and record.as_of


def test_unknown_offer(catalog: Catalog) -> None:
    with pytest.raises(UnknownNameError, match="aws-p5-on-demand"):
        offer(catalog, "aws-p5-ondemand")


def test_user_quote_overrides_builtin(tmp_path: Path) -> None:
    quote = tmp_path / "quote.yaml"
    quote.write_text(
        "cloud_offers:\n"
        "  - {id: aws-p5-on-demand, provider: AWS, sku: p5.48xlarge, gpu: h100-sxm, pricing: on-demand,\n"
        "     usd_per_gpu_hour: 4.0, as_of: '2026-12-01', source: our negotiated quote}\n"
    )
    assert offer(Catalog((quote,)), "aws-p5-on-demand").usd_per_gpu_hour == 4.0


def test_negative_price_is_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "cloud_offers:\n"
        "  - {id: mine, provider: X, sku: y, gpu: h100-sxm, pricing: on-demand,\n"
        "     usd_per_gpu_hour: -1, as_of: '2026-12', source: test}\n"
    )
    with pytest.raises(CatalogError, match="usd_per_gpu_hour"):
        Catalog((bad,)).records("cloud_offers")


def test_node_and_gpu_prices_must_agree() -> None:
    with pytest.raises(ValueError, match="disagrees"):
        CloudOffer(id="x", source="test", provider="p", sku="s", gpu="g", pricing="on-demand",
                   usd_per_gpu_hour=5.0, usd_per_node_hour=50.0, as_of="2026")


# ---- run_economics ---------------------------------------------------------------------------------

def test_run_economics_by_hand(catalog: Catalog) -> None:
    node = catalog.node("dgx-h100")
    run = run_economics(catalog, node=node, gpus=1024, train_time_s=30 * DAY, checkpoint_bytes=980e9)
    mtti = 54 * DAY * 16384 / (419 * 1024)  # Llama 3 rate scaled to 1,024 GPUs: 49.5 h
    assert run.mtti_s == pytest.approx(mtti)
    assert run.checkpoint_write_s == pytest.approx(980e9 / 500e9)  # 128 nodes x 4 GB/s capped at 500 GB/s
    assert run.wall_time_s == pytest.approx(30 * DAY / run.goodput)
    assert run.interruptions_expected == pytest.approx(run.wall_time_s / mtti)
    assert 0.98 < run.goodput < 1.0
    p5 = next(o for o in run.offers if o.name == "aws-p5-on-demand")
    assert p5.usd == pytest.approx(1024 * run.wall_time_s / 3600 * 6.88)
    assert run.racks == 43 and run.cooling == "rear-door"
    assert run.onprem_usd is not None and run.onprem_usd_per_gpu_hour is not None
    assert run.onprem_usd == pytest.approx(run.onprem_usd_per_gpu_hour * 1024 * run.wall_time_s / 3600)
    assert run.it_power_typical_w < run.it_power_max_w < run.facility_power_w


def test_run_economics_rejects_bad_input(catalog: Catalog) -> None:
    node = catalog.node("dgx-h100")
    with pytest.raises(InputError, match="GPU count"):
        run_economics(catalog, node=node, gpus=0, train_time_s=DAY, checkpoint_bytes=1e9)
    with pytest.raises(InputError, match="MFU"):
        run_economics(catalog, node=node, gpus=8, train_time_s=DAY, checkpoint_bytes=1e9, utilization_mfu=1.5)


@settings(max_examples=40, deadline=None)
@given(gpus=st.integers(min_value=1, max_value=8192), extra=st.integers(min_value=1, max_value=8192),
       days=st.floats(min_value=0.1, max_value=200))
def test_run_invariants(gpus: int, extra: int, days: float) -> None:
    catalog = Catalog()
    node = catalog.node("dgx-h100")
    def at(n: int) -> RunEconomics:
        return run_economics(catalog, node=node, gpus=n, train_time_s=days * DAY, checkpoint_bytes=1e12)

    small, large = at(gpus), at(gpus + extra)
    assert large.interruptions_expected >= small.interruptions_expected
    assert 0 < small.goodput <= 1 and 0 < large.goodput <= 1
    assert small.wall_time_s >= small.train_time_s


@settings(max_examples=200, deadline=None)
@given(price=st.floats(min_value=0.01, max_value=100), hours=st.floats(min_value=0, max_value=1e9),
       more=st.floats(min_value=0, max_value=1e9))
def test_cloud_cost_monotone_in_hours(price: float, hours: float, more: float) -> None:
    offer_ = CloudOffer(id="x", source="test", provider="p", sku="s", gpu="g", pricing="on-demand",
                        usd_per_gpu_hour=price, as_of="2026")
    assert cost_of_gpu_hours(offer_, hours + more).usd >= cost_of_gpu_hours(offer_, hours).usd


@settings(max_examples=100, deadline=None)
@given(low=st.floats(min_value=0.01, max_value=1), high=st.floats(min_value=0.01, max_value=1))
def test_onprem_rate_falls_with_utilization(low: float, high: float) -> None:
    low, high = sorted((low, high))
    tco = _simple_tco(energy_busy=50_000)
    assert tco.usd_per_gpu_hour(high) <= tco.usd_per_gpu_hour(low) + 1e-12


def test_every_offer_names_a_catalog_gpu(catalog: Catalog) -> None:
    gpus = set(catalog.records("gpus"))
    for record in catalog.records("cloud_offers").values():
        assert isinstance(record, CloudOffer) and record.gpu in gpus, record.id


def test_override_names_the_flag_and_the_allowed_range(catalog: Catalog) -> None:
    with pytest.raises(InputError, match=r"^--pue must be in \[1, 3\], got 0.5$"):
        facility_defaults(catalog, flags={"pue": "--pue"}, pue=0.5)
    with pytest.raises(InputError, match=r"^--years must be greater than 0, got 0$"):
        facility_defaults(catalog, flags={"amortization_years": "--years"}, amortization_years=0.0)
