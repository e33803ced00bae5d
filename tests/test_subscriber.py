"""The subscriber (``stampede/_async/subscriber.py``, its blocking twin generated): a
listener stopped because nobody used it starts again on demand, in both
flavours, and a waiter who comes in as it stops gets a new one."""

from __future__ import annotations

import asyncio

import redis
import redis.asyncio

from stampede._async.subscriber import async_subscriber_for
from stampede._sync.subscriber import subscriber_for
from tests.helpers import wait_until


def test_a_subscriber_closed_when_unused_starts_again_for_the_next_waiter(
    redis_url: str, namespace: str
) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    channel = f"{namespace}:wake".encode()
    subscriber = subscriber_for(client)
    try:
        first = subscriber.watch(channel)
        wait_until(lambda: first.live)
        subscriber.unwatch(first)
        subscriber.close()
        assert subscriber._listener.running is None
        assert subscriber_for(client) is subscriber
        again = subscriber.watch(channel)
        wait_until(lambda: again.live)
        again.event.clear()
        client.publish(channel, b"news")
        assert again.wait(5)
        subscriber.unwatch(again)
    finally:
        subscriber.close()
        client.close()


def test_an_asyncio_waiter_who_comes_in_as_the_listener_stops_is_served_by_a_new_one(
    redis_url: str, namespace: str
) -> None:
    channel = f"{namespace}:wake".encode()

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=5)
        subscriber = async_subscriber_for(client)
        try:
            first = subscriber.watch(channel)
            while not first.live:
                assert await first.wait(5)
                first.event.clear()
            subscriber.unwatch(first)
            stopping = asyncio.ensure_future(subscriber.aclose())
            await asyncio.sleep(0)  # aclose() has asked the listener to stop
            assert subscriber._stopping
            second = subscriber.watch(channel)
            await stopping
            while not second.live:
                assert await second.wait(5), "no listener subscribed the newcomer's channel"
                second.event.clear()
            await client.publish(channel, b"news")
            assert await second.wait(5)
            subscriber.unwatch(second)
        finally:
            await subscriber.aclose()
            await client.aclose()

    asyncio.run(main())
