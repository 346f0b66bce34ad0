from kv_store.eviction import PageInfo, create


def test_admits_only_what_was_asked_for_more_often():
    lfu = create("tinylfu", {"width": 256, "sample_size": 10_000})
    lfu.insert("hot", PageInfo())
    for _ in range(5):
        lfu.touch("hot")
    lfu.record("one-off")
    assert not lfu.admit("one-off", lfu.victim())
    for _ in range(10):
        lfu.record("rising")
    assert lfu.admit("rising", lfu.victim())


def test_old_popularity_fades():
    lfu = create("tinylfu", {"width": 64, "sample_size": 100})
    for _ in range(60):
        lfu.record("old")
    for i in range(400):
        lfu.record(f"other{i % 7}")
    assert lfu.frequency("old") < 20
