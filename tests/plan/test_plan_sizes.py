import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepserve.config.sizes import BINARY_UNITS, DECIMAL_UNITS, format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("38GB", 38_000_000_000),
        ("38 gb", 38_000_000_000),
        ("192KiB", 196_608),
        ("192 kib", 196_608),
        ("192KIB", 196_608),
        ("1.5GiB", 1_610_612_736),
        ("1.3GiB", 1_395_864_371),  # 1395864371.2: the fraction of a byte is dropped
        (".5KB", 500),
        ("2.", 2),
        ("4096", 4096),
        ("4096B", 4096),
        ("4096 b", 4096),
        ("0", 0),
        ("1KB", 1000),
        ("1MB", 1000**2),
        ("1TB", 1000**4),
        ("1MiB", 1024**2),
        ("2TiB", 2 * 1024**4),
        ("  7 GiB  ", 7 * 1024**3),
        (4096, 4096),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "GB",
        "38G",
        "38K",
        "38 GBs",
        "-1GB",
        "+1GB",
        "1.5",
        "1.5B",
        "abc",
        "1e9",
        "38 G B",
        "1,000",
        "1_000",
        "nanGB",
        "infGB",
        "1..5GB",
    ],
)
def test_parse_size_rejects(text):
    with pytest.raises(ValueError) as info:
        parse_size(text)
    message = str(info.value)
    assert repr(text) in message
    assert "KiB" in message and "GB" in message  # names the accepted forms


@pytest.mark.parametrize("value", [None, 1.5, -3, True, b"1GB"])
def test_parse_size_rejects_non_text(value):
    with pytest.raises(ValueError):
        parse_size(value)


@pytest.mark.parametrize(
    ("num_bytes", "expected"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1000, "1 KB"),
        (196_608, "192 KiB"),
        (131_072, "128 KiB"),
        (23_040, "22.5 KiB"),
        (38_000_000_000, "38 GB"),
        (805_306_368, "768 MiB"),
        (1_610_612_736, "1536 MiB"),  # whole numbers first
        (1_500_000_000, "1500 MB"),
        (123_456_789, "~117.74 MiB"),
    ],
)
def test_format_size(num_bytes, expected):
    assert format_size(num_bytes) == expected


@pytest.mark.parametrize("value", [-1, 1.5, True, "1"])
def test_format_size_rejects(value):
    with pytest.raises(ValueError):
        format_size(value)


@given(st.integers(min_value=0, max_value=2**52))
def test_exact_spellings_round_trip(num_bytes):
    text = format_size(num_bytes)
    if not text.startswith("~"):
        assert parse_size(text) == num_bytes


@given(
    st.integers(min_value=1, max_value=10**6),
    st.sampled_from(sorted({**DECIMAL_UNITS, **BINARY_UNITS}.items())),
)
def test_unit_multiples_round_trip(count, unit):
    name, scale = unit
    assert parse_size(f"{count}{name}") == count * scale
    assert parse_size(format_size(count * scale)) == count * scale
