import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from services.models.base import EncoderOutput
from services.stages.feature_cache import FeatureCache, cache_key


def _out(n):
    return EncoderOutput(embeddings=np.zeros((n, 4), np.float32), tiles=1)


def test_key_separates_tenants_versions_and_grids():
    base = cache_key("a", "h", "v1", "2x2@128/tiles-1")
    assert base != cache_key("b", "h", "v1", "2x2@128/tiles-1")
    assert base != cache_key("a", "h", "v2", "2x2@128/tiles-1")
    assert base != cache_key("a", "h", "v1", "1x1@128/tiles-1")
    assert base == cache_key("a", "h", "v1", "2x2@128/tiles-1")


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(1, 50)), max_size=60), st.integers(64, 4096))
def test_bounded_by_bytes_and_lru(ops, max_bytes):
    cache = FeatureCache(max_bytes)
    for key, n in ops:
        cache.put(str(key), _out(n))
        assert cache.bytes <= max_bytes
        if n * 16 <= max_bytes:
            assert cache.get(str(key)) is not None  # the newest fitting entry is always kept


def test_least_recently_used_goes_first():
    cache = FeatureCache(3 * 64)
    for k in "abc":
        cache.put(k, _out(4))
    cache.get("a")
    cache.put("d", _out(4))
    assert cache.get("b") is None and cache.get("a") is not None


def test_feature_versions_round_trip():
    from services.models.versions import FeatureVersions

    v = FeatureVersions("tiny_vit@abc", "tiny_vit@abc", "tiny_llama@def")
    assert FeatureVersions.parse(v.encode()) == v
    assert FeatureVersions.parse("garbage").llm == ""


def test_clear_empties_and_resets_the_byte_count():
    cache = FeatureCache(1024)
    cache.put("a", _out(4))
    cache.clear()
    assert len(cache) == 0 and cache.bytes == 0 and cache.get("a") is None
