"""The token stream from decode to a token talker, on a real Redis: chunks arrive in order and end at
the end entry; a reader that sees nothing for its wait gives up with TimeoutError (a thinker that
stalled or died) rather than waiting forever; a stream expires after its last write; a writer whose
Redis stays away stops writing (speech fails alone) instead of failing decode's response; a resumed
decode's writer appends after what a lost one wrote, and the talker reads both as one answer — the
lost one's later writes refused, tokens it wrote past the answer the gateway has not written twice,
tokens missing from the stream written ahead of the successor's, a stale decode that takes over
after a later one fenced off."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import pytest

from services.common.redis_config import async_client
from services.dataplane import token_stream
from services.dataplane.token_stream import TokenStreamWriter, read


@pytest.fixture
def redis(redis_url):
    return async_client(redis_url)


async def test_chunks_arrive_in_order_until_the_end(redis):
    stream = token_stream.key(uuid.uuid4().hex)
    writer = TokenStreamWriter(stream, redis)

    async def thinker():
        for chunk in ([1, 2], [3], [151645]):
            await writer.add(chunk)
            await asyncio.sleep(0.05)
        await writer.end()

    task = asyncio.create_task(thinker())
    got = [ids async for ids in read(stream, 5.0, redis)]
    await task
    assert got == [[1, 2], [3], [151645]]
    assert 0 < await redis.ttl(stream) <= token_stream.TTL_S


async def test_a_resumed_writer_appends_after_a_lost_ones_part(redis):
    stream = token_stream.key(uuid.uuid4().hex)
    lost = TokenStreamWriter(stream, redis)
    assert not await lost.take_over()  # a new stream: nothing before it
    await lost.add([1, 2])
    await lost.add([3])  # then its replica dies: no end entry
    resumed = TokenStreamWriter(stream, redis, attempt=1)
    assert await resumed.take_over([1, 2, 3]) and resumed.takeover == "continued"
    await resumed.add([4])
    await resumed.end()
    assert [ids async for ids in read(stream, 5.0, redis)] == [[1, 2], [3], [4]]


async def test_a_lost_writer_that_wakes_up_later_is_refused(redis):
    """A stalled decode resumed elsewhere, then let go on (its process continued): its writes after
    the take-over are refused by Redis and dropped, not interleaved with its successor's."""
    stream = token_stream.key(uuid.uuid4().hex)
    lost = TokenStreamWriter(stream, redis)
    await lost.take_over()
    await lost.add([1, 2])
    resumed = TokenStreamWriter(stream, redis, attempt=1)
    assert await resumed.take_over([1, 2])
    await resumed.add([3])
    await lost.add([8])  # refused: dropped, no exception
    await lost.end()
    assert lost.fenced and not resumed.broken
    await resumed.add([4])
    await resumed.end()
    assert [ids async for ids in read(stream, 5.0, redis)] == [[1, 2], [3], [4]]


async def test_tokens_a_lost_writer_wrote_past_the_answer_are_not_written_again(redis):
    """Decode writes a chunk before sending it: the gateway had [1, 2] when the decode was lost,
    the talker [1, 2, 3, 4]. The successor generates 3, 4 again (from the gateway's answer): those
    are not written a second time, what follows them is."""
    stream = token_stream.key(uuid.uuid4().hex)
    lost = TokenStreamWriter(stream, redis)
    await lost.take_over()
    await lost.add([1, 2])
    await lost.add([3, 4])
    resumed = TokenStreamWriter(stream, redis, attempt=1)
    assert await resumed.take_over([1, 2]) and (resumed.takeover, resumed.overlap) == ("overlap", 2)
    await resumed.add([3])
    await resumed.add([4, 5])
    await resumed.end()
    assert [ids async for ids in read(stream, 5.0, redis)] == [[1, 2], [3, 4], [5]]


async def test_tokens_the_answer_has_and_the_stream_lacks_go_ahead_of_the_successors(redis):
    stream = token_stream.key(uuid.uuid4().hex)
    lost = TokenStreamWriter(stream, redis)
    await lost.take_over()
    await lost.add([1])  # its next write was dropped (its Redis away), the gateway got [1, 2, 3]
    resumed = TokenStreamWriter(stream, redis, attempt=1)
    assert await resumed.take_over([1, 2, 3]) and resumed.takeover == "filled"
    await resumed.add([4])
    await resumed.end()
    assert [ids async for ids in read(stream, 5.0, redis)] == [[1], [2, 3, 4]]


async def test_a_successor_of_a_decode_lost_before_writing_writes_the_start(redis):
    """The lost decode wrote nothing (not even its fence): its successor hands the media rows (its
    take-over says the talker has nothing), then the answer the gateway has, then its own."""
    stream = token_stream.key(uuid.uuid4().hex)
    resumed = TokenStreamWriter(stream, redis, attempt=1)
    assert not await resumed.take_over([1, 2])
    await resumed.add_media_rows(np.ones((2, 4), dtype=np.float32))
    await resumed.add([3])
    await resumed.end()
    got = [item async for item in read(stream, 5.0, redis)]
    assert got[0].shape == (2, 4) and got[1:] == [[1, 2, 3]]


async def test_a_decode_whose_take_over_comes_after_its_successors_is_fenced_off(redis):
    """A decode given up before it began (its replica slow to start) begins after the gateway's
    next try took the stream over: the later try's epoch is higher, so the stale one is refused."""
    stream = token_stream.key(uuid.uuid4().hex)
    first = TokenStreamWriter(stream, redis)
    await first.take_over()
    await first.add([1])
    successor = TokenStreamWriter(stream, redis, attempt=2)
    assert await successor.take_over([1])
    stale = TokenStreamWriter(stream, redis, attempt=1)
    await stale.take_over([1])
    await stale.add([9])
    assert stale.fenced and not successor.broken
    await successor.add([2])
    await successor.end()
    assert [ids async for ids in read(stream, 5.0, redis)] == [[1], [2]]


async def test_a_silent_stream_times_out_within_its_wait(redis):
    stream = token_stream.key(uuid.uuid4().hex)
    await TokenStreamWriter(stream, redis).add([7])
    loop = asyncio.get_running_loop()
    start, got = loop.time(), []
    with pytest.raises(TimeoutError):
        async for ids in read(stream, 0.5, redis):
            got.append(ids)
    assert got == [[7]] and loop.time() - start < 0.5 + 2 * token_stream.BLOCK_MS / 1000 + 0.5


async def test_a_write_retried_after_a_slow_answer_is_not_read_twice(redis):
    """The first attempt lands but its answer times out: the retry is refused as a duplicate id."""
    import redis as redis_lib

    stream = token_stream.key(uuid.uuid4().hex)
    writer = TokenStreamWriter(stream, redis)
    execute = redis_lib.asyncio.client.Pipeline.execute
    calls = 0

    async def slow_once(self, *args, **kwargs):
        nonlocal calls
        calls += 1
        result = await execute(self, *args, **kwargs)
        if calls == 1:
            raise redis_lib.TimeoutError("answer lost")
        return result

    redis_lib.asyncio.client.Pipeline.execute = slow_once
    try:
        await writer.add([5, 6])
    finally:
        redis_lib.asyncio.client.Pipeline.execute = execute
    await writer.add([7])
    await writer.end()
    assert calls == 2
    assert [ids async for ids in read(stream, 2.0, redis)] == [[5, 6], [7]]


async def test_a_writer_whose_redis_stays_away_breaks_the_stream_not_the_response(monkeypatch):
    from services import runtime

    monkeypatch.setattr(token_stream, "WRITE_DEADLINE_S", 0.3)
    gone = async_client(f"redis://127.0.0.1:{runtime.free_port()}/0")  # nothing listens there
    writer = TokenStreamWriter(token_stream.key(uuid.uuid4().hex), gone)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await writer.add([1, 2])  # retried until its deadline, then given up: no exception
    assert writer.broken and loop.time() - start < 0.3 + 1.5
    start = loop.time()
    await writer.add([3])
    await writer.end()
    assert loop.time() - start < 0.05  # the rest are dropped at once
