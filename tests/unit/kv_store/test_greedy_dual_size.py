from kv_store.eviction import PageInfo, create


def test_cheap_large_pages_go_before_expensive_small_ones_and_credit_ages():
    gds = create("greedy_dual_size")
    gds.insert("text", PageInfo(size=4, cost=1.0))  # H = 0.25
    gds.insert("image", PageInfo(size=4, cost=8.0))  # H = 2.0: image KV is expensive to rebuild
    gds.insert("small", PageInfo(size=1, cost=1.0))  # H = 1.0
    assert gds.victim() == "text"
    gds.remove("text", evicted=True)  # L = 0.25
    assert gds.victim() == "small"
    gds.remove("small", evicted=True)  # L = 1.0
    gds.insert("new-text", PageInfo(size=4, cost=1.0))  # H = 1.25 < image's 2.0
    assert gds.victim() == "new-text"
    gds.touch("image")  # H = 1.0 + 2.0 = 3.0
    assert gds.victim() == "new-text"


def test_pinning_the_minimum_does_not_age_the_others():
    gds = create("greedy_dual_size")
    gds.insert("a", PageInfo(size=1, cost=1.0))
    gds.insert("b", PageInfo(size=1, cost=5.0))
    gds.remove("a")  # pinned, not evicted: L stays 0
    gds.insert("c", PageInfo(size=1, cost=2.0))
    assert gds.victim() == "c"
