"""A schedule entry: a task to enqueue on a cron spec (croniter) read in a timezone, or at
a fixed interval ('@every 30s'), and what to do with fires reached late (`missed`).

Entries come from the App's code (`app.periodic`) or from any client at run time
(`client.schedule`); both are stored in Redis alike and fired by `obsq scheduler`. Fire
times are epoch milliseconds, as Redis keeps them.

A cron spec follows the wall clock of its timezone across DST changes, as cron does: a time
of day the clocks skip fires when they jump (02:30 fires at 03:00), and one they repeat
fires once, at its first pass; a spec whose hour field is `*` runs every real hour, both
passes included."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import ModuleType
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import orjson

from obsq.names import validate_name
from obsq.settings import (
    SCHEDULE_COUNT_LIMIT,
    SCHEDULE_MIN_EVERY,
    SCHEDULE_NAME_MAX,
    SCHEDULES_SHOWN,
)
from obsq.task import Job, build_message, decode_stored_json, timestamp_to_datetime

if TYPE_CHECKING:
    from obsq.broker import Broker

log = logging.getLogger("obsq")

UTC = timezone.utc
UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
MISSED_POLICIES = ("skip", "once")
SOURCES = ("app", "client")
OPTIONS = ("queue", "max_retry", "timeout", "unique_for", "retention", "headers", "priority",
           "expires")
SET_BY_THE_SCHEDULER = ("task_id", "delay", "eta")
SCHEDULE_HEADER = "obsq-schedule"  # the entry's name, in the headers of each fire's task
FIRE_HEADER = "obsq-fire"  # the fire time it stands for, ISO 8601 in UTC
REPEATED_HOUR_SKIPS = 4000  # candidates of a repeated hour a cron spec may pass over


def parse_every(spec: str) -> float | None:
    """'@every 90s' -> 90.0; None when `spec` is not an interval."""
    if not spec.startswith("@every "):
        return None
    text = spec[len("@every "):].strip()
    unit = next((u for u in sorted(UNITS, key=len, reverse=True) if text.endswith(u)), None)
    try:
        seconds = float(text[: -len(unit)] if unit else text) * UNITS[unit or "s"]
    except ValueError:
        raise ValueError(f"{spec!r} is not an interval like '@every 30s'") from None
    if not seconds >= SCHEDULE_MIN_EVERY:
        raise ValueError(f"{spec!r}: the interval must be at least {SCHEDULE_MIN_EVERY:g} s")
    return seconds


def fire_text(ms: int) -> str:
    """A fire time as ISO 8601 in UTC, to the millisecond when it has one."""
    when = datetime.fromtimestamp(ms // 1000, UTC).replace(microsecond=ms % 1000 * 1000)
    return when.isoformat(timespec="milliseconds" if ms % 1000 else "seconds")[:-6] + "Z"


def fires_text(fires: tuple[int, ...]) -> str:
    """Claimed fires as a log names them: "the fire of <time>", or "the <n> fires of <first>
    to <last>"."""
    if len(fires) == 1:
        return f"the fire of {fire_text(fires[0])}"
    return f"the {len(fires)} fires of {fire_text(fires[0])} to {fire_text(fires[-1])}"


@dataclass(frozen=True)
class Plan:
    """What a scheduler does for an entry whose next fire is due: count `missed` fires
    (not enqueued), enqueue `catch_up` (missed="once": the latest missed fire) and each of
    `fires` (reached within `missed_after` of their time), then wait for `following`."""

    missed: int
    catch_up: int | None
    fires: tuple[int, ...]
    following: int


@dataclass(frozen=True)
class Schedule:
    """One entry; constructing it checks everything, so a bad one is refused before
    anything is written."""

    name: str
    spec: str
    task_type: str
    payload: Any = None
    timezone: str = "UTC"
    missed: str = "once"
    options: dict[str, Any] = field(default_factory=dict)
    source: str = "client"  # "app": defined in the App's code
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)
    _every_ms: int = field(init=False, repr=False, compare=False)
    _hourly: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_name("schedule", self.name)
        if len(self.name) > SCHEDULE_NAME_MAX:
            raise ValueError(f"schedule name {self.name!r} is longer than "
                             f"{SCHEDULE_NAME_MAX} characters")
        if not isinstance(self.spec, str):
            raise ValueError(f"spec must be a cron spec or '@every <interval>', "
                             f"got {self.spec!r}")
        every = parse_every(self.spec)
        if every is None and not _cron().croniter.is_valid(self.spec):
            raise ValueError(f"{self.spec!r} is neither a cron spec nor '@every <interval>'")
        validate_name("task type", self.task_type)
        if self.missed not in MISSED_POLICIES:
            raise ValueError(f"missed must be one of {', '.join(MISSED_POLICIES)}, "
                             f"got {self.missed!r}")
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {self.source!r}")
        object.__setattr__(self, "_zone", _zone(self.timezone))
        object.__setattr__(self, "_every_ms", round(every * 1000) if every else 0)
        object.__setattr__(self, "_hourly", not every and _every_hour(self.spec))
        _check_options(self.task_type, self.payload, self.options)
        if not every:
            try:
                self.next_after(int(datetime.now(UTC).timestamp() * 1000))
            except _cron().CroniterBadDateError:
                raise ValueError(f"{self.spec!r} never fires") from None

    # -- stored form ------------------------------------------------------------------------

    def encoded(self) -> bytes:
        """The definition as Redis keeps it; equal definitions encode to equal bytes."""
        return orjson.dumps({"spec": self.spec, "type": self.task_type,
                             "payload": self.payload, "timezone": self.timezone,
                             "missed": self.missed, "options": self.options,
                             "source": self.source}, option=orjson.OPT_SORT_KEYS)

    @classmethod
    def decode(cls, name: str, raw: bytes) -> Schedule:
        """The entry stored under `name`; ValueError when it is not a valid one."""
        try:
            d = orjson.loads(raw)
            if not isinstance(d, dict) or not isinstance(d.get("options", {}), dict):
                raise ValueError("not a JSON object with an object of options")
            return cls(name, d["spec"], d["type"], d.get("payload"),
                       d.get("timezone", "UTC"), d.get("missed", "once"),
                       d.get("options", {}), d.get("source", "client"))
        except KeyError as exc:
            raise ValueError(f"schedule {name!r} in Redis is not valid: it has no "
                             f"{exc.args[0]!r}") from None
        except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
            raise ValueError(f"schedule {name!r} in Redis is not valid: {exc}") from None

    # -- fire times -------------------------------------------------------------------------

    @property
    def every_ms(self) -> int:
        """The interval of an '@every' entry in ms; 0 for a cron spec."""
        return self._every_ms

    def next_after(self, ms: int) -> int:
        """The first fire strictly after `ms`."""
        if self._every_ms:
            return ms + self._every_ms
        times = _cron().croniter(self.spec, datetime.fromtimestamp(ms / 1000, self._zone))
        for _ in range(REPEATED_HOUR_SKIPS):
            when = times.get_next(datetime)
            fire = round(when.timestamp() * 1000)
            if fire > ms and not self._second_pass(when):
                return fire
        raise _cron().CroniterBadDateError(f"{self.spec!r}: no fire after {fire_text(ms)}")

    def _previous(self, ms: int) -> int:
        """The last cron fire at or before `ms`."""
        times = _cron().croniter(self.spec, datetime.fromtimestamp((ms + 1) / 1000, self._zone))
        for _ in range(REPEATED_HOUR_SKIPS):
            when = times.get_prev(datetime)
            if not self._second_pass(when):
                return round(when.timestamp() * 1000)
        raise _cron().CroniterBadDateError(f"{self.spec!r}: no fire before {fire_text(ms)}")

    def _second_pass(self, when: datetime) -> bool:
        """Whether `when` is the second pass through a wall-clock time the clocks repeat
        (which only a spec that runs every hour fires at)."""
        if self._hourly:
            return False
        naive = when.replace(tzinfo=None)
        first = naive.replace(tzinfo=self._zone, fold=0).utcoffset()
        second = naive.replace(tzinfo=self._zone, fold=1).utcoffset()
        return first is not None and second is not None and first > second and \
            when.utcoffset() == second

    def plan(self, next_ms: int, now_ms: int, missed_after_ms: int) -> Plan:
        """The fires due at `now_ms` from `next_ms` on: those more than `missed_after_ms`
        late are missed (one caught up when `missed` is "once"), the others enqueued."""
        cutoff = now_ms - missed_after_ms  # fires before it are missed
        fire, missed, last_missed = next_ms, 0, None
        if fire < cutoff:
            missed, last_missed, fire = self._fires_before(fire, cutoff)
        fires = []
        while fire <= now_ms:
            fires.append(fire)
            fire = self.next_after(fire)
        if missed and self.missed == "once":
            return Plan(missed - 1, last_missed, tuple(fires), fire)
        return Plan(missed, None, tuple(fires), fire)

    def _fires_before(self, fire: int, cutoff: int) -> tuple[int, int, int]:
        """(how many fires from `fire` on come before `cutoff`, the last of them, the first
        one after); past SCHEDULE_COUNT_LIMIT a cron spec's count stops there."""
        if self._every_ms:
            n = (cutoff - 1 - fire) // self._every_ms + 1
            last = fire + (n - 1) * self._every_ms
            return n, last, last + self._every_ms
        n, last = 0, fire
        while fire < cutoff:
            if n == SCHEDULE_COUNT_LIMIT:
                log.warning("schedule %s missed more than %d fires; %d are counted",
                            self.name, n, n)
                last = self._previous(cutoff - 1)
                return n, last, self.next_after(last)
            n, last, fire = n + 1, fire, self.next_after(fire)
        return n, last, fire

    # -- the task of a fire -----------------------------------------------------------------

    def task_id(self, fire_ms: int) -> str:
        """One id per fire, so that Redis refuses to enqueue a fire twice."""
        return f"{self.name}@{fire_text(fire_ms)}"

    def enqueue_options(self, fire_ms: int, min_retention: float) -> dict[str, Any]:
        """The options of Client.enqueue for a fire: the entry's, the fire's id and headers,
        and a retention of at least `min_retention`, so that a scheduler taking over a fire
        its predecessor may have enqueued finds the task even when it already ran."""
        headers = {**(self.options.get("headers") or {}), SCHEDULE_HEADER: self.name,
                   FIRE_HEADER: fire_text(fire_ms)}
        retention = max(self.options.get("retention") or 0.0, min_retention)
        return {**self.options, "headers": headers, "retention": retention,
                "task_id": self.task_id(fire_ms)}

    @property
    def digest(self) -> str:
        """SHA-1 of the stored form: a claim names the definition it was made under."""
        return hashlib.sha1(self.encoded()).hexdigest()


def _cron() -> ModuleType:
    """croniter, imported when a cron spec is first read: a process that reads none (a
    producer that defines no schedule) loads neither it nor dateutil."""
    import croniter

    return croniter


def _zone(name: str) -> ZoneInfo:
    if not isinstance(name, str) or not name:
        raise ValueError(f"timezone must be an IANA name such as 'Europe/Paris', got {name!r}")
    try:
        return ZoneInfo(name)
    except (KeyError, ValueError, OSError):
        raise ValueError(f"unknown timezone {name!r} (an IANA name such as "
                         "'Europe/Paris')") from None


def _every_hour(spec: str) -> bool:
    hours = _cron().croniter(spec).expanded[1]
    return hours == ["*"] or len(hours) == 24


def _check_options(task_type: str, payload: Any, options: dict[str, Any]) -> None:
    """The options must be those of Client.enqueue that make sense for every fire, with
    values it accepts, and the payload JSON."""
    if not isinstance(options, dict):
        raise TypeError(f"options must be a dict, got {type(options).__name__}")
    for name in options:
        if name in SET_BY_THE_SCHEDULER:
            raise ValueError(f"{name} cannot be given to a schedule: the scheduler sets it "
                             "for each fire")
        if name not in OPTIONS:
            raise TypeError(f"unknown schedule option {name!r} (options: {', '.join(OPTIONS)})")
    expires = options.get("expires")
    if expires is not None and (isinstance(expires, bool) or not isinstance(expires, (int, float))):
        raise TypeError(f"a schedule's expires is seconds from each fire's enqueue, got "
                        f"{expires!r}")
    if isinstance(payload, (bytes, bytearray, memoryview)):
        raise TypeError("a schedule's payload is stored as JSON: bytes cannot be given to a "
                        "schedule")
    build_message(Job(task_type, payload, **options))


@dataclass
class ScheduleInfo:
    """An entry as Redis holds it, with its next and last fire."""

    name: str
    spec: str
    type: str
    payload: Any
    timezone: str
    missed: str
    options: dict[str, Any]
    source: str  # "app" (the App's code) or "client" (added at run time)
    next_fire_at: datetime | None  # None while the entry is not valid
    last_fire_at: datetime | None  # the last fire enqueued
    fire_count: int  # fires enqueued
    missed_count: int  # fires missed and not enqueued (the `missed` policy)
    firing_at: datetime | None = None  # a fire claimed whose enqueue is not confirmed yet
    error: str | None = None  # why the scheduler skips it

    @classmethod
    def from_stored(cls, name: str, raw: bytes | None, next_ms: float, last_ms: int | None,
                    firing: bytes | None, fire_count: int, missed_count: int,
                    now_ms: int) -> ScheduleInfo:
        """`next_ms` 0: no scheduler has picked the entry up yet (its next fire is computed
        here); infinite: a scheduler found it invalid."""
        try:
            entry = Schedule.decode(name, raw or b"")
        except ValueError as exc:
            stored = decode_stored_json(raw)
            spec = stored.get("spec") if isinstance(stored, dict) else None
            return cls(name, str(spec or ""), "", None, "", "", {}, "", None,
                       timestamp_to_datetime(last_ms), fire_count, missed_count,
                       _firing_at(firing), str(exc))
        upcoming = entry.next_after(now_ms) if next_ms == 0 else next_ms
        return cls(name, entry.spec, entry.task_type, entry.payload, entry.timezone,
                   entry.missed, entry.options, entry.source,
                   timestamp_to_datetime(int(upcoming)) if upcoming != float("inf") else None,
                   timestamp_to_datetime(last_ms), fire_count, missed_count,
                   _firing_at(firing))


def claim_text(fires: tuple[int, ...], definition: bytes) -> bytes:
    """Claimed fires as stored: "<fire ms>[,<fire ms>...] <definition>"."""
    return b"%s %s" % (b",".join(b"%d" % fire for fire in fires), definition)


def parse_claim(raw: bytes) -> tuple[tuple[int, ...], bytes]:
    """Claimed fires as stored: (their times in ms, oldest first, the definition they run);
    ValueError when it is not a claim."""
    fires, _, definition = raw.partition(b" ")
    return tuple(int(fire) for fire in fires.split(b",")), definition


def _firing_at(raw: bytes | None) -> datetime | None:
    try:
        return timestamp_to_datetime(parse_claim(raw)[0][0]) if raw else None
    except ValueError:
        return None


async def read_schedules(broker: Broker, limit: int = SCHEDULES_SHOWN) -> list[ScheduleInfo]:
    """Up to `limit` schedule entries, soonest next fire first (the Client's and the
    Inspector's listing)."""
    now_ms, records = await broker.schedule_table(limit)
    return [ScheduleInfo.from_stored(*record, now_ms=now_ms) for record in records]
