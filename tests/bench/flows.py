"""What a chord of N members costs Redis: `python tests/bench/flows.py [--members 10000]`
starts a private redis-server, enqueues a chord whose members return a result of about 100
bytes, and prints Redis's used memory before, while the members wait, once the callback
ran, and after the flow's retention; with the time from enqueue to the callback's result.
A report: it asserts nothing."""

from __future__ import annotations

import argparse
import asyncio
import time

import redis.asyncio as aioredis

import obsq
from obsq.redis_server import RedisServer, free_port

app = obsq.App(namespace="bench-flows")


@app.task("member", max_retry=0)
async def member(task: obsq.Task) -> str:
    return "r" * 100


@app.task("callback", max_retry=0)
async def callback(task: obsq.Task) -> int:
    return len(task.previous)


async def used(r: aioredis.Redis) -> int:
    return int((await r.info("memory"))["used_memory"])


async def main(members: int) -> None:
    server = RedisServer(free_port(), config={"save": "", "appendonly": "no"}).start()
    url = f"redis://127.0.0.1:{server.port}/0"
    r = aioredis.Redis.from_url(url)
    try:
        worker = obsq.Worker(app, redis_url=url, concurrency=200, handle_signals=False)
        async with obsq.Client(url, app=app) as client:
            await client.enqueue("member")  # the queue registered, scripts loaded
            await asyncio.sleep(0)
            base = await used(r)
            started = time.perf_counter()
            flow = await client.enqueue(obsq.chord([obsq.Job("member") for _ in range(members)],
                                                   obsq.Job("callback"), retention=2))
            waiting = await used(r)
            running = asyncio.create_task(worker.run())
            assert await client.result(flow, timeout=600) == members
            took = time.perf_counter() - started
            ended = await used(r)
            await asyncio.sleep(3)
            after = await used(r)
            worker.stop()
            await running
        print(f"chord of {members:,} members, 100-byte results, on one worker of 200 slots")
        print(f"  used memory before           {base:>12,} B")
        print(f"  members waiting              {waiting - base:>+12,} B "
              f"({(waiting - base) / members:,.0f} B a member)")
        print(f"  callback done (results kept) {ended - base:>+12,} B "
              f"({(ended - base) / members:,.0f} B a member)")
        print(f"  after the flow's retention   {after - base:>+12,} B")
        print(f"  enqueue to result            {took:>12.2f} s")
    finally:
        await r.aclose()
        server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--members", type=int, default=10_000)
    asyncio.run(main(parser.parse_args().members))
