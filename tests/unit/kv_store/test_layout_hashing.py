import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kv_store.hashing import ChainHasher, MediaSpan, page_hashes, token_elements
from kv_store.layout import PageLayout


@given(
    st.integers(1, 8),
    st.integers(1, 4),
    st.sampled_from([16, 64, 128]),
    st.sampled_from([1, 16]),
    st.sampled_from(["float16", "float32"]),
    st.sampled_from([1, 2]),
)
def test_slices_tile_the_page_without_overlap(layers, heads, head_dim, tokens, dtype, parts):
    layout = PageLayout(layers, heads, head_dim, tokens, dtype, parts)
    offsets = sorted(layout.offset(layer, part) for layer in range(layers) for part in range(parts))
    assert offsets == [i * layout.slice_bytes for i in range(layers * parts)]
    page = np.arange(layout.page_bytes, dtype=np.uint8) % 251
    view = layout.view(page)
    assert view.shape == (layers, parts, tokens, heads, head_dim)
    raw = view[layers - 1, parts - 1].tobytes()
    assert raw == page[layout.offset(layers - 1, parts - 1) :][: layout.slice_bytes].tobytes()


def test_from_hf_config_and_errors():
    layout = PageLayout.from_hf_config(
        {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128}, 16
    )
    assert (layout.num_kv_heads, layout.head_dim, layout.page_bytes) == (2, 32, 2 * 2 * 16 * 2 * 32 * 2)
    with pytest.raises(ValueError):
        PageLayout(1, 1, 1, 1, "int4")


def test_chained_hashes_share_exactly_the_common_prefix():
    a = page_hashes([list(range(40))], 16, "llm@1")
    b = page_hashes([list(range(32)) + [999] * 8], 16, "llm@1")
    assert len(a) == 2 and a[:2] == b[:2]
    c = page_hashes([[999] + list(range(1, 40))], 16, "llm@1")
    assert c[0] != a[0] and c[1] != a[1]  # a change in page 0 changes every later page
    assert page_hashes([list(range(40))], 16, "llm@2")[0] != a[0]


def test_media_pages_depend_on_content_encoder_and_position():
    img = MediaSpan("sha-img", "vit@1", 20)
    base = page_hashes([[1, 2, 3], img, [4] * 9], 8, "llm")
    assert base == page_hashes([[1, 2, 3], img, [4] * 9], 8, "llm")
    assert base != page_hashes([[1, 2, 3], MediaSpan("sha-other", "vit@1", 20), [4] * 9], 8, "llm")
    assert base != page_hashes([[1, 2, 3], MediaSpan("sha-img", "vit@2", 20), [4] * 9], 8, "llm")
    assert base[0] != page_hashes([[1, 2], img, [4] * 10], 8, "llm")[0]


@given(st.lists(st.integers(0, 50_000), max_size=120), st.lists(st.integers(1, 30), max_size=10))
def test_incremental_hashing_equals_hashing_the_whole_sequence(tokens, cuts):
    """The connector feeds a request's tokens as they are computed; any feeding order of the same
    sequence names the same pages."""
    hasher = ChainHasher(16, "llm", salt="tenant")
    at = 0
    for n in cuts:
        hasher.feed(token_elements(tokens[at : at + n]))
        at += n
    hasher.feed(token_elements(tokens[at:]))
    assert hasher.pages == page_hashes([tokens], 16, "llm", salt="tenant")
    assert hasher.tokens == len(tokens)
    assert (hasher.tail() is None) == (len(tokens) % 16 == 0)


def test_partial_tail_and_salt_never_collide_with_full_pages():
    full = ChainHasher(16, "llm")
    full.feed(token_elements(range(16)))
    part = ChainHasher(16, "llm")
    part.feed(token_elements(range(15)))
    assert part.tail() not in full.pages and part.tail() != full.tail()
    other = ChainHasher(16, "llm")
    other.feed(token_elements(range(14)))
    assert other.tail() != part.tail()
    assert page_hashes([list(range(16))], 16, "llm", salt="a") != page_hashes(
        [list(range(16))], 16, "llm", salt="b"
    )
