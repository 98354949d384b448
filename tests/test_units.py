"""units.format_bytes and units.parse_bytes (its suffixes and bounds)."""

from __future__ import annotations

import pytest

from gpufleet.errors import InputError
from gpufleet.units import format_bytes, parse_bytes


@pytest.mark.parametrize(("value", "text"), [
    (0, "0 B"), (1, "1 B"), (0.5, "0.5 B"), (1023, "1023 B"), (1024, "1 KiB"), (1536, "1.5 KiB"),
    (512 * 2**10, "512 KiB"), (2**20 - 1, "1 MiB"), (2**30, "1 GiB"), (1.25 * 2**30, "1.25 GiB"),
    (2**40, "1 TiB"), (10**15, "909 TiB"), (2**50, "1 PiB"), (2**60, "1 EiB"), (1e30, "8.67e+11 EiB"),
])
def test_format_bytes_uses_binary_units_and_about_three_digits(value: float, text: str) -> None:
    assert format_bytes(value) == text


@pytest.mark.parametrize(("text", "value"), [
    ("1", 1), ("512", 512), ("1KB", 10**3), ("1KiB", 2**10), ("1k", 2**10), ("4GB", 4e9), ("1GiB", 2**30),
    ("1TB", 10**12), ("1TiB", 2**40), ("1T", 2**40), ("1PB", 10**15), ("1PiB", 2**50), ("1P", 2**50),
    (" 1.5 mib ", 1.5 * 2**20),
])
def test_parse_bytes_takes_decimal_and_binary_suffixes_up_to_peta(text: str, value: float) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["0", "1e400", "-1", "1XB", "GiB", ""])
def test_parse_bytes_refuses_what_is_not_a_positive_finite_size(text: str) -> None:
    with pytest.raises(InputError):
        parse_bytes(text)


@pytest.mark.parametrize(("text", "message"), [
    ("2TiB", "--size 2TiB is 2 TiB; it must be at most 1 TiB; per rank"),
    ("1PB", "--size 1PB is 909 TiB; it must be at most 1 TiB; per rank"),
    ("0.5", "--size 0.5 is 0.5 B; it must be at least 1 B; per rank"),
    ("0", "--size 0 is 0 B; it must be at least 1 B; per rank"),
])
def test_parse_bytes_bounds_are_one_line(text: str, message: str) -> None:
    with pytest.raises(InputError) as error:
        parse_bytes(text, "--size", least_bytes=1, most_bytes=2**40, note="per rank")
    assert str(error.value) == message


def test_parse_bytes_accepts_its_bounds_themselves() -> None:
    assert parse_bytes("1", least_bytes=1, most_bytes=2**40) == 1
    assert parse_bytes("1TiB", least_bytes=1, most_bytes=2**40) == 2**40
    assert parse_bytes("1", most_bytes=2**40) == 1
