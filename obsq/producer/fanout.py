"""What a producer does to fan work in and out: check a grouped task (it waits in its group
for the App's aggregator, so the options of a task that runs do not apply to it), and turn
a published event into one job per live subscriber."""

from __future__ import annotations

from typing import Any

from obsq.names import subscriber_task_type, validate_name
from obsq.settings import EVENT_KEEP
from obsq.task import Job, new_task_id

# The headers every copy of an event carries: which event, which publish, which subscriber.
EVENT_HEADER = "obsq-event"
EVENT_ID_HEADER = "obsq-event-id"
SUBSCRIBER_HEADER = "obsq-subscriber"


def check_grouped(group: str, options: dict[str, Any]) -> str:
    """`group` if valid and no option of a running task is given (ValueError otherwise):
    a grouped task only waits; its aggregated task gets the options."""
    validate_name("group", group)
    given = sorted(name for name, value in options.items() if value is not None)
    if given:
        raise ValueError(f"a grouped task takes no {', '.join(given)}: it waits in group "
                         f"{group!r} for its aggregator, whose task gets the options")
    return group


def event_jobs(event: str, payload: Any, subscribers: list[tuple[str, str]],
               event_id: str | None, headers: dict[str, str] | None) -> list[Job]:
    """One job per (subscriber, queue): type `<event>@<subscriber>`, id
    `<event_id>.<subscriber>` when the publisher named the event, kept EVENT_KEEP after it
    ends (the same publish sent again meanwhile delivers nothing twice), the event headers
    beside the caller's."""
    shared = {**(headers or {}), EVENT_HEADER: event,
              EVENT_ID_HEADER: event_id or new_task_id()}
    return [Job(subscriber_task_type(event, name), payload, queue=queue,
                task_id=f"{event_id}.{name}" if event_id else None,
                retention=EVENT_KEEP if event_id else None,
                headers={**shared, SUBSCRIBER_HEADER: name})
            for name, queue in subscribers]


def check_event(event: str, event_id: str | None) -> None:
    validate_name("event", event)
    if "@" in event:
        raise ValueError(f"event {event!r} may not hold '@'")
    if event_id is not None:
        validate_name("event_id", event_id)
