"""A flow traces as one trace: its steps' messages are one batch (a `create` span per step
under one `send`), each step's `process` span the child of its message's, and each step's
message span linked to those of the steps it waits for (a chord's callback to every
member's)."""

from __future__ import annotations

from opentelemetry import trace
from support import wait_until

import obsq
from obsq import Job, chain, chord

tracer = trace.get_tracer("tests")


async def test_a_flow_is_one_trace_each_step_linked_to_the_one_before(
        app, redis_url, namespace, spans, start_worker) -> None:
    @app.task("step")
    async def step(task: obsq.Task):
        return 1

    await start_worker(tracing=True)
    client = obsq.Client(redis_url, namespace=namespace, app=app)
    with tracer.start_as_current_span("checkout") as caller:
        flow = await client.enqueue(chain(Job("step"), chord([Job("step"), Job("step")],
                                                             Job("step"))))
    assert await client.result(flow, timeout=20) == 1
    await wait_until(lambda: len([s for s in spans.get_finished_spans()
                                  if s.name == "process default"]) == 4, what="4 spans")
    finished = spans.get_finished_spans()
    creates = {s.attributes["messaging.message.id"]: s for s in finished
               if s.name == "create default"}
    processes = {s.attributes["messaging.message.id"]: s for s in finished
                 if s.name == "process default"}
    ids = [s.id for s in flow.steps]
    assert set(creates) == set(processes) == set(ids)
    root = caller.get_span_context().trace_id
    assert {s.context.trace_id for s in (*creates.values(), *processes.values())} == {root}
    for step_info in flow.steps:
        create = creates[step_info.id]
        assert processes[step_info.id].parent.span_id == create.context.span_id
        linked = {link.context.span_id for link in create.links}
        assert linked == {creates[ids[d]].context.span_id for d in step_info.waits_for}
    assert flow.steps[3].waits_for == [1, 2] and flow.steps[1].waits_for == [0]
    await client.close()
