"""obsq benchmark: obsq against dramatiq and taskiq, each on its own private redis-server.

    python tests/bench/run.py                 # obsq, its baseline, dramatiq, taskiq: ~2-4 min
    python tests/bench/run.py --only obsq     # obsq and its baseline (no peers)
    python tests/bench/run.py --only obsq --no-baseline   # obsq alone
    python tests/bench/run.py --overhead      # obsq drain: off / metrics / tracing / both
    python tests/bench/run.py --only obsq --profile   # + a drain under py-spy

A report, not a test: nothing here asserts on timings. See README.md in this folder."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import (
    Contender,
    against,
    baseline,
    default_ref,
    guard_loops,
    has_uvloop,
    median_of,
    versions_of_extras,
)
from harness import (
    REPO,
    Child,
    ChildError,
    OtlpSink,
    PySpy,
    RedisServer,
    find_redis_server,
    free_port,
    percentile,
    run_child,
)
from systems import NAMESPACE

ALL_SYSTEMS = ("obsq", "dramatiq", "taskiq")
DEFAULT_TASKS = 20000  # the size the targets are set for
QUICK_TASKS = 10000  # the guard's size with --quick
CURRENT = Contender("obsq", "obsq")  # the checkout's obsq
AUTO_LOOP = "uvloop" if has_uvloop() else "asyncio"  # where CURRENT's worker runs (auto)
PEERS = ("dramatiq", "taskiq")
POLL = 0.005  # seconds between drain checks
STALL = 20.0  # seconds without progress before a drain is reported as stuck
CALIBRATE = 200  # done-checks timed on the idle server before each drain
BULK_HOW = {
    "obsq": "enqueue_many, chunks of 1,000",
    "dramatiq": "broker.enqueue in a loop (no bulk API)",
    "taskiq": "kiq in a loop (no bulk API)",
}


# ------------------------------------------------------------- queue state, per system


def backlog(system: str, r) -> int:
    """Tasks not yet finished (waiting or running), read from the system's own keys."""
    if system == "obsq":
        p = r.pipeline(transaction=False)
        p.llen("bench:{default}:pending")
        p.zcard("bench:{default}:lease")  # leased = running
        p.hlen("bench:{default}:active")  # the attempts' owners, also cleared on ack
        pending, leased, active = p.execute()
        return pending + max(leased, active)
    if system == "dramatiq":
        # each message lives in this hash from enqueue until its ack
        return int(r.hlen("dramatiq:default.msgs"))
    if system == "taskiq":
        try:
            groups = r.xinfo_groups("taskiq")
        except redis.ResponseError:  # no stream yet
            return 0
        if not groups:
            return int(r.xlen("taskiq"))
        g = groups[0]
        lag = g.get("lag")
        if lag is None:  # Redis < 7: compare the group's position with the stream's end
            last = r.xinfo_stream("taskiq")["last-generated-id"]
            lag = 0 if g["last-delivered-id"] == last else 1
        return int(g["pending"]) + int(lag)
    raise ValueError(system)


# ------------------------------------------------------------------------ workloads


def _how(c: Contender) -> dict:
    """How to start a child of contender `c` (run_child's and Child's keywords)."""
    return {"env": c.env, "obsq_from": c.obsq_from}


def enqueue(c: Contender, rs: RedisServer, n: int, mode: str, task: str = "noop") -> dict:
    cpu0 = rs.cpu_seconds()
    res = run_child([c.system, "enqueue", "--url", rs.url, "--n", str(n), "--mode", mode,
                     "--task", task], label=f"{c.label} enqueue {mode}", **_how(c))
    cpu1 = rs.cpu_seconds()
    return {"n": n, "seconds": res["elapsed"], "rate": n / res["elapsed"],
            "redis_cpu_us": (cpu1 - cpu0) * 1e6 / n}


def ping(rs: RedisServer, n: int, mode: str) -> dict:
    """redis-py PING one at a time (`sync` or `async`) on the same server: the limit."""
    cpu0 = rs.cpu_seconds()
    res = run_child(["obsq", "ping", "--url", rs.url, "--n", str(n), "--mode", mode],
                    label=f"{mode} ping")
    cpu1 = rs.cpu_seconds()
    return {"n": n, "seconds": res["elapsed"], "rate": n / res["elapsed"],
            "redis_cpu_us": (cpu1 - cpu0) * 1e6 / n}


def worker_args(system: str, rs: RedisServer, opts: dict) -> list[str]:
    args = [system, "worker", "--url", rs.url, "--concurrency", "10"]
    if opts.get("metrics"):
        args += ["--metrics", "--http-port", str(free_port())]
    if opts.get("tracing"):
        args.append("--tracing")
    return args


def drain(c: Contender, rs: RedisServer, n: int, *, opts: dict | None = None,
          env: dict | None = None, pickup_n: int = 0, rate: float = 200.0,
          profile: str | None = None, out: dict | None = None, task: str = "noop",
          name: str = "drain") -> dict:
    """Fill the queue with n tasks of `task` (the timed bulk enqueue), start one worker,
    time the drain (as out[name]); then, optionally, the pickup latency of the same worker
    once idle."""
    opts = opts or {}
    system = c.system
    out = {} if out is None else out  # filled as figures arrive, so a failure keeps them
    out["enqueue_bulk" if name == "drain" else f"{name}_fill"] = enqueue(c, rs, n, "bulk", task)
    r = rs.client
    have = backlog(system, r)
    if have != n:
        raise ChildError(f"{system}: {have} tasks queued after enqueuing {n}")

    w = Child(worker_args(system, rs, opts), env={**c.env, **(env or {})},
              label=f"{c.label} worker", obsq_from=c.obsq_from)
    spy = None
    try:
        w.expect("ready", 60)
        if profile:
            spy = PySpy(w.pid, profile)
        # what one done-check costs Redis, so its share of the drain's Redis CPU is known
        c0 = rs.cpu_seconds()
        for _ in range(CALIBRATE):
            backlog(system, r)
        poll_cost = (rs.cpu_seconds() - c0) / CALIBRATE
        polls = 0
        cpu0, rt0 = rs.cpu_seconds(), time.perf_counter()
        w.send("GO")
        go = w.expect("go", 30)
        last, progress_at = n, time.perf_counter()
        while left := backlog(system, r):
            polls += 1
            now = time.perf_counter()
            if left < last:
                last, progress_at = left, now
            elif now - progress_at > STALL:
                raise ChildError(
                    f"{system}: drain stalled, {left} of {n} tasks unfinished for {STALL:.0f}s"
                    f"\n{w.tail()}"
                )
            w.check_alive()
            # every 5 ms, later every 0.5 % of the time so far: the clock's error stays
            # under 0.5 % while the checks' own Redis load stays small on long drains
            time.sleep(min(0.05, max(POLL, (now - rt0) * 0.005)))
        seconds = time.perf_counter() - rt0
        cpu1 = rs.cpu_seconds()
        if spy:
            spy.stop()
        w.send("MARK")
        mark = w.expect("mark", 30)
        handled = mark["handled"] - go["handled"]
        out[name] = {
            "n": n, "seconds": seconds, "rate": n / seconds,
            "redis_cpu_us": (cpu1 - cpu0) * 1e6 / n,
            "worker_cpu_us": (mark["cpu"] - go["cpu"]) * 1e6 / n,
            "round_trips": (mark["calls"] - go["calls"]) / n,
            "peak_rss_mb": mark["peak_rss_mb"], "handled": handled,
            "polls": polls + 1, "poll_redis_cpu_us": (polls + 1) * poll_cost * 1e6 / n,
        }
        if handled != n:
            out[name]["warning"] = f"handler ran {handled} times for {n} tasks"

        if pickup_n:
            time.sleep(1.0)  # let the worker go idle (blocked / polling)
            res = run_child([system, "pickup", "--url", rs.url, "--n", str(pickup_n),
                             "--rate", str(rate)], label=f"{c.label} pickup", **_how(c))
            deadline = time.perf_counter() + STALL
            while backlog(system, r) and time.perf_counter() < deadline:
                time.sleep(POLL)
            time.sleep(0.05)
        ex = w.finish(60)
        if pickup_n:
            lat = [x * 1000 for x in ex["latencies"]]
            out["pickup"] = {
                "n": pickup_n, "rate": rate, "achieved_rate": pickup_n / res["elapsed"],
                "received": len(lat), "p50_ms": percentile(lat, 50),
                "p99_ms": percentile(lat, 99), "max_ms": max(lat) if lat else float("nan"),
            }
        out[name]["peak_rss_mb"] = max(out[name]["peak_rss_mb"], ex["peak_rss_mb"])
        if ex.get("loop"):
            out[name]["loop"] = ex["loop"]
    finally:
        if spy:
            spy.stop()
        w.close()
    return out


DRIFTS: list[str] = []  # what `obsq doctor` found after an obsq drain: the run fails


def doctor(c: Contender, rs: RedisServer) -> None:
    """`obsq doctor` (the checkout's) on the namespace an obsq drain left: a counter that
    drifted under load, or an id left behind, is printed and fails the run (exit 1)."""
    done = subprocess.run(
        [sys.executable, "-m", "obsq", "doctor", "--redis-url", rs.url, "--namespace",
         NAMESPACE], capture_output=True, text=True, cwd=str(REPO), timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    if done.returncode:
        DRIFTS.append(f"{c.label}: {(done.stdout + done.stderr).strip()}")


def bench_system(c: Contender, binary: str, args) -> dict:
    res: dict = {}
    system = c.system
    with RedisServer(binary) as rs:
        try:
            res["enqueue_single"] = enqueue(c, rs, args.single, "single")
            if system == "obsq":  # its other producer paths, and the limits beside them
                res["enqueue_sync"] = enqueue(c, rs, args.single, "sync")
                res["enqueue_concurrent"] = enqueue(c, rs, args.tasks, "concurrent")
                res["ping_sync"] = ping(rs, args.single, "sync")
                res["ping_async"] = ping(rs, args.single, "async")
            rs.flush()
            opts = {"metrics": args.metrics, "tracing": args.tracing} if system == "obsq" else {}
            with OtlpSink() as sink:
                env = sink.env if opts.get("tracing") else None
                drain(c, rs, args.tasks, opts=opts, env=env, pickup_n=args.pickup, out=res)
                if env:
                    res["otlp"] = {
                        "requests": sink.requests, "bytes": sink.bytes, "spans": sink.spans
                    }
            if system == "obsq":
                doctor(c, rs)
            rs.flush()
            drain(c, rs, args.tasks, opts=opts, env=env, out=res, task="io", name="drain_io")
            if system == "obsq" and not args.tracing and not args.no_traced:  # traced
                for name, traced_env in TRACED_DRAINS.items():
                    rs.flush()
                    with OtlpSink() as sink:
                        drain(c, rs, args.tasks, opts={**opts, "tracing": True},
                              env={**sink.env, **traced_env}, out=res, name=name)
                        res[name]["spans"] = sink.spans
        except ChildError as e:
            res["error"] = str(e)
            print(f"!! {c.label} failed:\n{e}", file=sys.stderr)
    return res


# The sampler a busy service would run: one root trace in ten, and a task traced when the
# request that enqueued it was (the bench's tasks come without a trace: one in ten).
SAMPLED_ENV = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"}
# The traced drains of obsq and what each adds to the receiver's variables: at 100 % (through
# fastotel, OBSQ_FASTOTEL=true), the same through the SDK's own exporter, and sampled.
TRACED_DRAINS = {"drain_traced": {"OBSQ_FASTOTEL": "true"}, "drain_traced_sdk": {},
                 "drain_sampled": SAMPLED_ENV}


def overhead(binary: str, args) -> dict:
    configs = {
        "off": {},
        "metrics": {"metrics": True},
        "tracing": {"tracing": True},
        "both": {"metrics": True, "tracing": True},
    }
    out = {}
    for name, opts in configs.items():
        with RedisServer(binary) as rs, OtlpSink() as sink:
            env = sink.env if opts.get("tracing") else None
            try:
                d = drain(CURRENT, rs, args.tasks, opts=opts, env=env)["drain"]
            except ChildError as e:
                print(f"!! obsq ({name}) failed:\n{e}", file=sys.stderr)
                d = {"error": str(e)}
            if env:
                d["otlp_requests"], d["otlp_spans"] = sink.requests, sink.spans
            out[name] = d
    return out


# --------------------------------------------------------------------------- report


def fmt(v, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if v != v:  # nan
        return "n/a"
    if abs(v) >= 1000:
        s = f"{v:,.0f}"
    elif abs(v) >= 100:
        s = f"{v:.0f}"
    elif abs(v) >= 10:
        s = f"{v:.1f}"
    else:
        s = f"{v:.2f}"
    return f"{s}{unit}" if unit == "x" else f"{s} {unit}".rstrip()


def get(res: dict, system: str, section: str, key: str):
    return res.get(system, {}).get(section, {}).get(key)


def layout(rows: list[tuple[str, ...]], right: tuple[int, ...] = ()) -> list[str]:
    """Rows of cells (a header first, if any) as lines, each column as wide as its widest
    cell; the columns numbered in `right` are aligned right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                      for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
            for row in rows]


def table(title: str, rows: list[tuple[str, str, str]], res: dict, systems) -> list[str]:
    """rows: (label, section, key); ratio = system / obsq."""
    cells = [("figure", "system", "value", "ratio vs obsq")]
    for label, section, key in rows:
        ref = get(res, "obsq", section, key)
        for i, system in enumerate(systems):
            v = get(res, system, section, key)
            if v is None:
                v = "error" if "error" in res.get(system, {}) else "-"
            ratio = "-"
            if isinstance(v, (int, float)) and isinstance(ref, (int, float)) and ref:
                ratio = f"{v / ref:.2f}x"
            cells.append((label if i == 0 else "", system, fmt(v), ratio))
    return [f"== {title} ==", *layout(cells, right=(2, 3))]


def targets(res: dict) -> list[tuple[str, str, str, bool | None]]:
    o = res.get("obsq", {})
    d, p = o.get("drain", {}), o.get("pickup", {})
    es, eb = o.get("enqueue_single", {}), o.get("enqueue_bulk", {})
    peers = [(get(res, s, "drain", "rate"), s) for s in res if s in PEERS]
    peers = [(r, s) for r, s in peers if r]
    out = []

    def add(name, want, value, ok, unit=""):
        out.append((name, want, _measured(value, unit),
                    None if value is None else ok))

    rate = d.get("rate")
    add("drain throughput", ">= 20,000 tasks/s", rate, rate is not None and rate >= 20000,
        "tasks/s")
    if peers:
        best, who = max(peers)
        x = rate / best if rate else None
        add(f"drain vs fastest peer ({who})", ">= 7x", x, x is not None and x >= 7, "x")
    else:
        add("drain vs fastest peer", ">= 7x", None, False)
    io_peers = [(r, s) for r, s in ((get(res, s, "drain_io", "rate"), s) for s in res
                                    if s in PEERS) if r]
    io = o.get("drain_io", {}).get("rate")
    if io_peers:
        best, who = max(io_peers)
        x = io / best if io else None
        add(f"drain, 1 Redis call/task, vs {who}", ">= 4x", x, x is not None and x >= 4, "x")
    else:
        add("drain, 1 Redis call/task, vs best peer", ">= 4x", None, False)
    v = d.get("worker_cpu_us")
    add("worker CPU / no-op task (drain)", "<= 30 us", v, v is not None and v <= 30, "us")
    v = d.get("round_trips")
    add("round trips / task (drain)", "<= 0.5", v, v is not None and v <= 0.5)
    v = d.get("redis_cpu_us")
    add("Redis CPU / task (drain)", "<= 15 us", v, v is not None and v <= 15, "us")
    v = p.get("p99_ms")
    add("pickup p99 at 200/s", "< 2 ms", v, v is not None and v < 2, "ms")
    v = es.get("rate")
    add("enqueue, one at a time", ">= 8,000 /s", v, v is not None and v >= 8000, "/s")
    v = eb.get("rate")
    add("enqueue_many", ">= 50,000 /s", v, v is not None and v >= 50000, "/s")
    v = d.get("peak_rss_mb")
    add("worker peak RSS", "< 80 MB", v, v is not None and v < 80, "MB")
    return out


def _ratio(a, b):
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def _added_cpu(measured: dict, plain: dict) -> float | None:
    """The worker CPU per task a drain took beyond the plain drain's, when both have it."""
    if "worker_cpu_us" in measured and "worker_cpu_us" in plain:
        return measured["worker_cpu_us"] - plain["worker_cpu_us"]
    return None


NOT_MEASURED = "not measured"
REPORT = "(report)"  # a figure shown beside its limit, with no target to meet


def producer_rows(res: dict) -> list[tuple[str, str, str, str, str, bool | None]]:
    """Issue rows: (path, value, the limit beside it, ratio, target, met), all measured in
    this run on the same server; met is None where there is no verdict: a (report) row, or
    a figure or its limit not measured in this run (said in its value or limit)."""
    o = res.get("obsq", {})
    rows = []

    def add(path, value, limit, ratio, target, ok):
        rows.append((path, value, limit, "" if ratio is None else f"{ratio:.2f}x", target,
                     None if ratio is None or target == REPORT else ok))

    sync, single = get(res, "obsq", "enqueue_sync", "rate"), get(res, "obsq",
                                                                 "enqueue_single", "rate")
    ping_s, ping_a = get(res, "obsq", "ping_sync", "rate"), get(res, "obsq", "ping_async",
                                                                 "rate")
    x = _ratio(sync, ping_s)
    add("SyncClient.enqueue, one at a time", _rate(sync), f"sync PING {_rate(ping_s)}",
        x, ">= 0.8x", x is not None and x >= 0.8)
    send = get(res, "dramatiq", "enqueue_single", "rate")
    x = _ratio(sync, send)
    add("  beside dramatiq's send", _rate(sync), f"dramatiq send {_rate(send)}", x,
        "> 1x", x is not None and x > 1)
    x = _ratio(single, ping_a)
    add("Client.enqueue, one await at a time", _rate(single),
        f"async PING {_rate(ping_a)}", x, ">= 0.7x", x is not None and x >= 0.7)
    kiq = get(res, "taskiq", "enqueue_single", "rate")
    x = _ratio(single, kiq)
    add("  beside taskiq's kiq", _rate(single), f"taskiq kiq {_rate(kiq)}", x, "> 1x",
        x is not None and x > 1)
    conc = get(res, "obsq", "enqueue_concurrent", "rate")
    x = _ratio(conc, 30000)
    add("1,000 concurrent Client.enqueue", _rate(conc), "30,000 /s", x, ">= 1x",
        x is not None and x >= 1)
    bulk = get(res, "obsq", "enqueue_bulk", "rate")
    x = _ratio(conc, bulk)
    add("  beside enqueue_many", _rate(conc), f"enqueue_many {_rate(bulk)}", x, REPORT, None)
    cpu, ping_cpu = (get(res, "obsq", "enqueue_single", "redis_cpu_us"),
                     get(res, "obsq", "ping_async", "redis_cpu_us"))
    x = _ratio(cpu, ping_cpu)
    add("Redis CPU per single enqueue", _measured(cpu, "us"),
        f"a PING's {_measured(ping_cpu, 'us')}", x, "<= 1.6x", x is not None and x <= 1.6)
    plain, traced = o.get("drain", {}), o.get("drain_traced", {})
    untraced = f"untraced {_rate(plain.get('rate'))}"
    x = _ratio(traced.get("rate"), plain.get("rate"))
    add("drain traced at 100%, exported", _rate(traced.get("rate")), untraced, x, ">= 0.5x",
        x is not None and x >= 0.5)
    extra = _added_cpu(traced, plain)
    rows.append(("  worker CPU per traced task",
                 NOT_MEASURED if extra is None else f"+{fmt(extra, 'us')}",
                 f"untraced {_measured(plain.get('worker_cpu_us'), 'us')}", "", "<= +60 us",
                 None if extra is None else extra <= 60))
    sdk = o.get("drain_traced_sdk", {})
    x = _ratio(sdk.get("rate"), plain.get("rate"))
    add("  the same through the SDK's exporter", _rate(sdk.get("rate")), untraced, x, REPORT,
        None)
    sdk_extra = _added_cpu(sdk, plain)
    if sdk_extra is not None:
        rows.append(("  its worker CPU per traced task", f"+{fmt(sdk_extra, 'us')}",
                     "OBSQ_FASTOTEL unset", "", REPORT, None))
    sampled = o.get("drain_sampled", {})
    x = _ratio(sampled.get("rate"), plain.get("rate"))
    add("drain traced at 10% (sampled), exported", _rate(sampled.get("rate")), untraced, x,
        REPORT, None)
    for key, label, target in (("drain_io", "drain, one awaited Redis call/task", REPORT),
                               ("drain", "drain, no-op handler", ">= 7x")):
        mine = get(res, "obsq", key, "rate")
        peers = [(get(res, s, key, "rate"), s) for s in res if s in PEERS]
        peers = [(r, s) for r, s in peers if r]
        best, who = max(peers) if peers else (None, "best peer")
        x = _ratio(mine, best)
        add(label, _rate(mine), f"{who} {_rate(best)}", x, target, x is not None and x >= 7)
    return rows


def _measured(v, unit: str = "") -> str:
    return NOT_MEASURED if v is None else fmt(v, unit)


def _rate(v) -> str:
    return _measured(v, "/s")


def report(res: dict, systems, args) -> None:
    n = args.tasks
    blocks = [
        table(f"1. drain: {n:,} queued no-op tasks, 1 worker process, concurrency 10", [
            ("tasks/s (higher is better)", "drain", "rate"),
            ("drain seconds", "drain", "seconds"),
            ("Redis CPU us/task", "drain", "redis_cpu_us"),
            ("worker CPU us/task", "drain", "worker_cpu_us"),
            ("worker peak RSS MB", "drain", "peak_rss_mb"),
        ], res, systems),
        table("2. round trips per task during the drain (client side, redis-py writes)", [
            ("round trips/task", "drain", "round_trips"),
        ], res, systems),
        table(f"3. enqueue: {args.single:,} one at a time; {n:,} bulk", [
            ("one at a time, tasks/s", "enqueue_single", "rate"),
            ("  Redis CPU us/task", "enqueue_single", "redis_cpu_us"),
            ("bulk, tasks/s", "enqueue_bulk", "rate"),
            ("  Redis CPU us/task", "enqueue_bulk", "redis_cpu_us"),
        ], res, systems),
        table(f"3b. drain: {n:,} tasks whose handler makes one awaited Redis call (INCR)", [
            ("tasks/s (higher is better)", "drain_io", "rate"),
            ("worker CPU us/task", "drain_io", "worker_cpu_us"),
            ("Redis CPU us/task", "drain_io", "redis_cpu_us"),
        ], res, systems),
        table(f"4. pickup latency of an idle worker: {args.pickup:,} tasks at 200/s", [
            ("p50 ms", "pickup", "p50_ms"),
            ("p99 ms", "pickup", "p99_ms"),
            ("max ms", "pickup", "max_ms"),
        ], res, systems),
    ]
    for b in blocks:
        print("\n".join(b))
        print()
    print("bulk paths: " + "; ".join(f"{s}: {BULK_HOW[s]}" for s in systems if s in BULK_HOW))
    share = [
        f"{s} {fmt(get(res, s, 'drain', 'poll_redis_cpu_us'))}"
        for s in systems
        if get(res, s, "drain", "poll_redis_cpu_us") is not None
    ]
    if share:
        print(
            "Redis CPU/task above includes the harness' own done-checks, about (us/task): "
            + ", ".join(share)
        )
    for s in systems:
        for section in ("drain", "pickup"):
            w = res.get(s, {}).get(section, {}).get("warning")
            if w:
                print(f"warning: {s} {section}: {w}")
        pk = res.get(s, {}).get("pickup")
        if pk and pk["received"] != pk["n"]:
            print(f"warning: {s} pickup: {pk['received']} of {pk['n']} latencies recorded")
    if "otlp" in res.get("obsq", {}):
        o = res["obsq"]["otlp"]
        print(
            f"OTLP receiver got {o['requests']} requests, {o['bytes']:,} bytes, "
            f"{fmt(o['spans'])} spans (drain + pickup: {args.tasks + args.pickup:,} tasks)"
        )
    if "obsq" in systems:
        judged = args.tasks >= DEFAULT_TASKS
        if not judged:
            print(f"\nthe targets below are set for the default --tasks {DEFAULT_TASKS:,}: "
                  f"in this scaled-down run ({args.tasks:,}) they are shown for reference, "
                  "not judged")
        print("\n== obsq's producer and tracing vs their limits, measured in this run ==")
        print("\n".join(judge(("path", "value", "limit beside it", "ratio", "target"),
                               producer_rows(res), judged, right=(1, 3))))
        print("one at a time: sync = SyncClient / dramatiq send; async = Client / taskiq kiq; "
              "the PINGs are redis-py's, one at a time, on obsq's server")
        traced = res.get("obsq", {}).get("drain_traced")
        if traced:
            print(f"traced drain: the bench's OTLP receiver got {fmt(traced.get('spans'))} "
                  f"spans for {traced['n']:,} tasks (one process span each)")
        sampled = res.get("obsq", {}).get("drain_sampled")
        if sampled:
            print(f"sampled drain: {fmt(sampled.get('spans'))} spans for {sampled['n']:,} "
                  f"tasks ({' '.join(f'{k}={v}' for k, v in SAMPLED_ENV.items())})")
        print("\n== obsq vs targets ==")
        print("\n".join(judge(("figure", "target", "value"), targets(res), judged,
                               right=(2,))))


def judge(head: tuple[str, ...], rows: list[tuple], judged: bool,
          right: tuple[int, ...] = ()) -> list[str]:
    """A table of rows whose last item is met (True, False, or None: no verdict); with
    `judged` a verdict column gives PASS or MISS, else there is none."""
    if not judged:
        return layout([head, *(row[:-1] for row in rows)], right)
    return layout([(*head, "verdict"),
                   *((*row[:-1], "" if row[-1] is None else "PASS" if row[-1] else "MISS")
                     for row in rows)], right)


def report_overhead(ov: dict) -> None:
    base = ov.get("off", {})
    print("== obsq observability overhead: drain, 1 worker, concurrency 10 ==")
    print(f"{'config':<9} {'tasks/s':>9} {'wall us/task':>13} {'+ vs off':>9} "
          f"{'worker CPU us/task':>19} {'+ vs off':>9} {'Redis CPU us/task':>18} "
          f"{'spans exported':>15}")
    for name, d in ov.items():
        if "error" in d:
            print(f"{name:<9} error")
            continue
        wall = 1e6 / d["rate"]
        dwall = wall - 1e6 / base["rate"] if "rate" in base else float("nan")
        dcpu = d["worker_cpu_us"] - base.get("worker_cpu_us", float("nan"))
        print(f"{name:<9} {fmt(d['rate']):>9} {fmt(wall):>13} {fmt(dwall):>9} "
              f"{fmt(d['worker_cpu_us']):>19} {fmt(dcpu):>9} {fmt(d['redis_cpu_us']):>18} "
              f"{fmt(d.get('otlp_spans')):>15}")


def report_rounds(rounds: list[dict], labels: list[str]) -> None:
    """The drains of each round, so the spread behind each median shows."""
    print("\n== drains per round, tasks/s (no-op / one awaited Redis call) ==")
    rows = []
    for label in labels:
        cells = [f"{fmt(get(r, label, 'drain', 'rate'))} / {fmt(get(r, label, 'drain_io', 'rate'))}"
                 for r in rounds]
        loop = get(rounds[0], label, "drain", "loop")
        rows.append((label, *cells, f"(loop: {loop})" if loop else ""))
    print("\n".join(layout(rows, right=tuple(range(1, len(rounds) + 1)))))


# The guard's figures first, in this order, named; the other figures both sides have follow.
GUARD_FIGURES = {
    "drain.rate": "drain, no-op: tasks/s",
    "drain.worker_cpu_us": "  worker CPU us/task",
    "drain.redis_cpu_us": "  Redis CPU us/task",
    "drain.round_trips": "  round trips/task",
    "drain.peak_rss_mb": "  worker peak RSS MB",
    "drain_io.rate": "drain, one awaited Redis call: tasks/s",
    "drain_io.worker_cpu_us": "  worker CPU us/task",
    "drain_io.redis_cpu_us": "  Redis CPU us/task",
    "drain_io.round_trips": "  round trips/task",
    "drain_io.peak_rss_mb": "  worker peak RSS MB",
    "enqueue_concurrent.rate": "Client.enqueue, 1,000 concurrent: tasks/s",
    "enqueue_concurrent.redis_cpu_us": "  Redis CPU us/enqueue",
    "enqueue_bulk.rate": "enqueue_many, chunks of 1,000: tasks/s",
    "enqueue_bulk.redis_cpu_us": "  Redis CPU us/task",
    "enqueue_single.rate": "Client.enqueue, one at a time: tasks/s",
    "enqueue_single.redis_cpu_us": "  Redis CPU us/enqueue",
    "enqueue_sync.rate": "SyncClient.enqueue, one at a time: tasks/s",
    "enqueue_sync.redis_cpu_us": "  Redis CPU us/enqueue",
    "drain_io_fill.rate": "enqueue_many of the io drain: tasks/s",
    "drain_io_fill.redis_cpu_us": "  Redis CPU us/task",
}
# redis-py alone, the same code on both sides: their ratio is the run's noise, not judged
NOISE = {"ping_sync.rate": "sync PING (redis-py, not obsq): /s",
         "ping_async.rate": "async PING (redis-py, not obsq): /s"}


def guard_rows(current: dict, base: dict) -> list[tuple[str, str, float, float, float, bool]]:
    """(figure, its name, current, baseline, ratio, worse by more than 5 %): against()'s
    rows, the guard's figures first, then the others, then the PINGs (never worse)."""
    rows = {figure: row for figure, *row in against(current, base)}
    named = [(f, GUARD_FIGURES[f], *rows.pop(f)) for f in GUARD_FIGURES if f in rows]
    noise = [(f, NOISE[f], *rows.pop(f)[:3], False) for f in NOISE if f in rows]
    others = [(f, f, *row) for f, row in rows.items() if not f.startswith("ping_")]
    return named + others + noise


def report_baseline(current: dict, base: dict, mine: str, theirs: str, loop: str) -> list[str]:
    """The guard table on `loop`: every figure of `mine` (the checkout) against `theirs`
    (the baseline), ratio mine / theirs, each worse by more than 5 % flagged; it says the
    loop each side's worker ran on, and that they differ if they do. Returns the flagged
    figures."""
    ran = current.get("drain", {}).get("loop"), base.get("drain", {}).get("loop")
    print(f"\n== guard on {loop}: {mine} vs {theirs}, same run, interleaved; "
          f"ratio = {mine} / {theirs} ==")
    print(f"worker loop measured: {mine} {ran[0] or '-'}, {theirs} {ran[1] or '-'}; "
          "producers on asyncio's loop on both sides")
    if ran[0] != ran[1]:
        print("!! the workers ran on different loops: not like with like")
    rows = guard_rows(current, base)
    print("\n".join(layout([("figure", mine, theirs, "ratio", "verdict"), *(
        (name, fmt(now), fmt(then), f"{ratio:.2f}x", "WORSE by more than 5 %" if worse
         else "") for _, name, now, then, ratio, worse in rows)], right=(1, 2, 3))))
    worse = [f"{figure} {ratio:.2f}x" for figure, _, _, _, ratio, worse in rows if worse]
    print(f"{len(worse)} of {len(rows)} figures worse by more than 5 %"
          + (f": {'; '.join(worse)}" if worse else ""))
    return worse


def _terminate(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwind, so private redis-servers and children stop


def main() -> None:
    signal.signal(signal.SIGTERM, _terminate)
    sys.stdout.reconfigure(line_buffering=True)
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=ALL_SYSTEMS, action="append",
                   help="run only this system (repeatable); default: all three; obsq "
                        "comes with its baseline unless --no-baseline")
    p.add_argument("--tasks", type=int,
                   help=f"tasks in the drain and the bulk enqueue (default {DEFAULT_TASKS}; "
                        "the targets are judged only at this size or above); "
                        "one-at-a-time enqueue uses a quarter, pickup a twentieth; "
                        f"{QUICK_TASKS} with --quick")
    p.add_argument("--json", nargs="?", const="/tmp/obsq-bench.json", metavar="PATH",
                   help="also write all figures as JSON (default path /tmp/obsq-bench.json)")
    p.add_argument("--metrics", action="store_true", help="obsq worker with metrics=True")
    p.add_argument("--tracing", action="store_true",
                   help="obsq worker with tracing=True, exporting to a local OTLP receiver")
    p.add_argument("--overhead", action="store_true",
                   help="only: obsq drain four times (off, metrics, tracing, both)")
    p.add_argument("--profile", nargs="?", const="/tmp/obsq-drain.svg", metavar="SVG",
                   help="also run one obsq drain under py-spy (flame graph to SVG, "
                        "default /tmp/obsq-drain.svg)")
    p.add_argument("--profile-task", choices=("noop", "io"), default="noop",
                   help="the handler of the profiled drain (default noop)")
    p.add_argument("--redis-server", help="redis-server binary (default: newest on PATH)")
    p.add_argument("--rounds", type=int,
                   help="interleaved rounds (each system in turn per round); the report "
                        "gives each figure's median (default 1, 3 with --quick)")
    p.add_argument("--baseline-ref", metavar="REF",
                   help="git ref of obsq to run beside the checkout in the same run, "
                        "installed without its dependencies into a scratch directory and "
                        "run by this Python (default: the newest tag before HEAD, else "
                        "HEAD~1)")
    p.add_argument("--no-baseline", action="store_true", help="run no baseline")
    p.add_argument("--asyncio", action="store_true",
                   help="also run the checkout's obsq on asyncio's loop (OBSQ_LOOP=asyncio)")
    p.add_argument("--loop", choices=("asyncio", "uvloop", "both"),
                   help="the worker loop(s) the baseline guard compares on, the checkout and "
                        "the baseline on the same one (default: both where uvloop is "
                        "installed and the baseline can choose its loop, else asyncio)")
    p.add_argument("--quick", action="store_true",
                   help="the baseline guard alone: the checkout and the baseline on each "
                        "guard loop, no peers, no traced drains, no pickup; --tasks 10000 "
                        "and --rounds 3 unless given")
    p.add_argument("--no-traced", action="store_true",
                   help="skip obsq's three traced drains (quicker rounds)")
    args = p.parse_args()
    if args.quick and (args.no_baseline or args.overhead
                       or (args.only and args.only != ["obsq"])):
        p.error("--quick is the baseline guard: not with --no-baseline, --overhead or peers")
    if args.quick:
        args.only, args.no_traced = ["obsq"], True
    args.tasks = args.tasks or (QUICK_TASKS if args.quick else DEFAULT_TASKS)
    args.rounds = args.rounds or (3 if args.quick else 1)
    args.single = max(1, args.tasks // 4)
    args.pickup = 0 if args.quick else max(50, args.tasks // 20)
    systems = tuple(s for s in ALL_SYSTEMS if not args.only or s in args.only)

    binary, version = find_redis_server(args.redis_server)
    print(f"obsq benchmark  python {sys.version.split()[0]}  redis-server {version} ({binary})")
    print(f"one private redis-server per system; worker: 1 process, concurrency 10; "
          f"obsq metrics={args.metrics} tracing={args.tracing}")
    print("ratio column = system / obsq (for tasks/s higher is better, for costs lower)\n")
    started = time.monotonic()
    figures: dict = {"redis_version": version, "tasks": args.tasks}

    if args.overhead:
        ov = overhead(binary, args)
        report_overhead(ov)
        figures["overhead"] = ov
    else:
        contenders = [Contender(s, s) for s in systems]
        if "obsq" in systems and args.asyncio:
            contenders.insert(1, CURRENT.on("asyncio"))
        pairs = []  # (loop, the checkout's contender, the baseline's), the guard's
        if "obsq" in systems and not args.no_baseline:
            base = baseline(args.baseline_ref or default_ref())
            loops, why = guard_loops(args.loop, base)
            if why:
                print(why)
            if args.quick:  # the pairs alone
                contenders = []
            for loop in loops:
                mine = (CURRENT if not args.quick and loop == AUTO_LOOP
                        else CURRENT.on(loop))
                if mine not in contenders:
                    contenders.append(mine)
                contenders.append(base.on(loop))
                pairs.append((loop, mine, base.on(loop)))
            print(f"baseline guard: {', '.join(f'{m.label} vs {b.label}' for _, m, b in pairs)}"
                  f"; both sides on this Python with {versions_of_extras()}\n")
        rounds, loads = [], []
        for i in range(args.rounds):
            loads.append(os.getloadavg()[0])
            res = {}
            # every other round in the reverse order, so a drift of the load hits both sides
            for c in contenders if i % 2 == 0 else contenders[::-1]:
                t = time.monotonic()
                res[c.label] = bench_system(c, binary, args)
                print(f"[round {i + 1}/{args.rounds}: {c.label} done in "
                      f"{time.monotonic() - t:.0f}s, load {os.getloadavg()[0]:.2f}]",
                      file=sys.stderr)
            rounds.append(res)
        labels = [c.label for c in contenders]
        res = {label: median_of([r[label] for r in rounds]) for label in labels}
        print(f"{args.rounds} interleaved round(s), the median of each figure; load average "
              f"(1 min) at each round's start: {', '.join(f'{x:.2f}' for x in loads)}, at "
              f"the end: {os.getloadavg()[0]:.2f}\n")
        if not args.quick:
            report(res, labels, args)
        report_rounds(rounds, labels)
        figures["guard"] = {}
        for loop, mine, theirs in pairs:
            figures["guard"][loop] = report_baseline(res[mine.label], res[theirs.label],
                                                     mine.label, theirs.label, loop)
        figures["results"] = res
        figures["rounds"] = rounds
        figures["load"] = loads
    if args.profile:
        opts = {"metrics": args.metrics, "tracing": args.tracing}
        with RedisServer(binary) as rs, OtlpSink() as sink:
            env = sink.env if args.tracing else None
            d = drain(CURRENT, rs, args.tasks, opts=opts, env=env, task=args.profile_task,
                      profile=args.profile)["drain"]
        print(
            f"\nprofiled obsq drain (metrics={args.metrics} tracing={args.tracing}, "
            f"py-spy attached): {fmt(d['rate'])} tasks/s; flame graph: {args.profile}"
        )
        figures["profiled_drain"] = d
    print(f"\ntotal {time.monotonic() - started:.0f}s")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
        print(f"figures written to {args.json}")
    if DRIFTS:
        print("\nobsq doctor found damage after a drain:\n" + "\n".join(DRIFTS), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
