from support import wait_until

import obsq


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
