import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepserve.config.sizes import parse_size
from stepserve.plan.capacity import capacity


def test_seed_promotion_spike():
    r = capacity(parse_size("38GB"), parse_size("192KiB"), 4096, 0.15, 140)
    assert r.kv_bytes_per_token == 196_608
    assert r.tokens_capacity == 38_000_000_000 // 196_608
    assert r.bytes_per_seq == 4096 * 196_608
    assert r.seqs_per_replica == 47  # 47.19
    assert r.max_num_seqs == 40  # 47.19 x 0.85 = 40.11; flooring 47 first would give 39
    assert r.replicas == 3  # "2 replicas cannot take 140"
    assert r.queued_at_peak == 20  # within the promo-spike fix's max_waiting 24
    assert r.replicas_within_headroom == 4


def test_headroom_is_exact_decimal():
    per_seq = 4096 * 1024
    # 100 sequences exactly, keep 10% free -> exactly 90 (binary 0.1 would give 89).
    assert capacity(100 * per_seq, 1024, 4096, 0.1, 1).max_num_seqs == 90
    assert capacity(100 * per_seq, 1024, 4096, 0.3, 1).max_num_seqs == 70
    assert capacity(100 * per_seq, 1024, 4096, 0, 1).max_num_seqs == 100


def test_small_peak_needs_one_replica():
    r = capacity(parse_size("38GB"), parse_size("192KiB"), 4096, 0.15, 10)
    assert r.replicas == 1
    assert r.queued_at_peak == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"kv_memory_bytes": 0}, "kv_memory_bytes"),
        ({"kv_memory_bytes": -5}, "kv_memory_bytes"),
        ({"kv_memory_bytes": 38e9}, "kv_memory_bytes"),
        ({"kv_bytes_per_token": 0}, "kv_bytes_per_token"),
        ({"max_len": 0}, "max_len"),
        ({"max_len": True}, "max_len"),
        ({"peak_concurrency": 0}, "peak_concurrency"),
        ({"headroom": 1.0}, "headroom"),
        ({"headroom": -0.1}, "headroom"),
        ({"headroom": float("nan")}, "headroom"),
        ({"headroom": "0.15"}, "headroom"),
    ],
)
def test_rejects_bad_inputs(kwargs, field):
    args = {
        "kv_memory_bytes": 38_000_000_000,
        "kv_bytes_per_token": 196_608,
        "max_len": 4096,
        "headroom": 0.15,
        "peak_concurrency": 140,
        **kwargs,
    }
    with pytest.raises(ValueError, match=field):
        capacity(**args)


def test_no_sequence_fits():
    with pytest.raises(ValueError, match="no sequence fits"):
        capacity(parse_size("500MB"), parse_size("192KiB"), 4096, 0.15, 10)


def test_headroom_leaves_no_sequence():
    with pytest.raises(ValueError, match="lower headroom"):
        capacity(parse_size("1GiB"), 1024, 1024 * 1024, 0.5, 10)


@given(
    st.integers(1, 10**12),
    st.integers(1, 10**6),
    st.integers(1, 10**5),
    st.floats(0, 0.9),
    st.integers(1, 10**4),
)
def test_invariants(kv, per_token, max_len, headroom, peak):
    try:
        r = capacity(kv, per_token, max_len, headroom, peak)
    except ValueError:
        return  # nothing fits: covered above
    assert 1 <= r.max_num_seqs <= r.seqs_per_replica
    assert r.seqs_per_replica * r.bytes_per_seq <= kv < (r.seqs_per_replica + 1) * r.bytes_per_seq
    assert r.replicas * r.seqs_per_replica >= peak > (r.replicas - 1) * r.seqs_per_replica
    assert r.replicas_within_headroom >= r.replicas
