"""The console's HTTP application: the pages (overview, queue with its task groups, a group's
tasks, task, workers, schedules, flows and a flow's steps), the actions (POST only, with a
CSRF token or a bearer token), and /metrics, /healthz, /readyz.

Every page refreshes itself: console.js fetches the same URL every few seconds with the
header X-Obsq-Fragment and swaps in the live part of the page, which the template renders
alone for such a request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote, unquote, urlencode, urlsplit

from prometheus_client.exposition import choose_encoder
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from obsq.broker import DEPTH_STATES, TASK_STATES
from obsq.broker.inspection import REVIVABLE
from obsq.errors import BrokerError, QueueNotFound, TaskNotFound, TaskRunning
from obsq.inspection.inspector import Inspector, Rate
from obsq.ops.ui.auth import SESSION_COOKIE, SESSION_SECONDS, Auth
from obsq.ops.ui.render import environment, trace_link

PAGE_SIZE = 25
FRAGMENT_HEADER = "x-obsq-fragment"
FLASH_COOKIE = "obsq_flash"
READY_TIMEOUT = 2.0
SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
     b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),  # no-referrer would make POSTs send Origin: null
]
Refused = (QueueNotFound, TaskNotFound, TaskRunning, ValueError)
# a flow's and a step's states drawn in the colours of the task states (completed, dead and
# cancelled are task states themselves)
FLOW_STYLES = {"running": "active", "failed": "dead"}
STEP_STYLES = {"waiting": "pending", "launching": "scheduled", "enqueued": "pending",
               "running": "active"}


def create_app(inspector: Inspector, *, token: str | None = None, read_only: bool = False,
               trace_url: str | None = None) -> Starlette:
    """The console for `inspector`'s namespace. Without `token` (or with `read_only`) it
    only shows; `trace_url` links each task to its trace ('...{trace_id}...')."""
    c = Console(inspector, Auth(token, read_only), trace_url)
    routes = [
        Route("/", c.overview, name="overview"),
        Route("/queues/{queue}", c.queue, name="queue"),
        Route("/queues/{queue}/group", c.group, name="group"),
        # a task id may hold '/' (%2F, which the server decodes before routing)
        Route("/tasks/{task_id:path}", c.task, name="task"),
        Route("/workers", c.workers, name="workers"),
        Route("/schedules", c.schedules, name="schedules"),
        Route("/flows", c.flows, name="flows"),
        Route("/flows/{flow_id}", c.flow, name="flow"),
        Route("/search", c.search, name="search"),
        Route("/login", c.login_form, name="login"),
        Route("/login", c.login, methods=["POST"]),
        Route("/logout", c.logout, methods=["POST"], name="logout"),
        Route("/queues/{queue}/{action:str}", c.queue_action, methods=["POST"],
              name="queue_action"),
        Route("/tasks/{task_id:path}/{action:str}", c.task_action, methods=["POST"],
              name="task_action"),
        Route("/metrics", c.metrics),
        Route("/healthz", c.healthz),
        Route("/livez", c.healthz),
        Route("/readyz", c.readyz),
        Mount("/static", StaticFiles(packages=[("obsq.ops.ui", "static")]), name="static"),
    ]
    handlers: dict[Any, Any] = {QueueNotFound: c.not_found, TaskNotFound: c.not_found,
                                BrokerError: c.unavailable, ValueError: c.bad_request}
    app = Starlette(routes=routes, exception_handlers=handlers)
    app.add_middleware(SecurityHeaders)
    return app


class SecurityHeaders:
    """CSP (scripts and styles from the console itself only, no inline script), and the
    headers that keep the pages out of frames and their URLs out of Referer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers if scope["type"] == "http" else send)


class Console:
    def __init__(self, inspector: Inspector, auth: Auth, trace_url: str | None) -> None:
        self.inspector = inspector
        self.auth = auth
        self.trace_url = trace_url
        self.templates = Jinja2Templates(env=environment())
        self._registry: Any = None

    # -- pages ----------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        queues, workers = await asyncio.gather(self.inspector.queues(),
                                               self.inspector.workers())
        totals = {s: sum(q.depth[s] for q in queues) for s in DEPTH_STATES}
        hour = Rate(sum(q.last_hour.processed for q in queues),
                    sum(q.last_hour.failed for q in queues))
        minute = Rate(sum(q.last_minute.processed for q in queues),
                      sum(q.last_minute.failed for q in queues))
        # Running is what the workers run (their heartbeats' busy slots), as their rows
        # say; the queues' active count also holds the tasks a worker fetched ahead into
        # its buffer and those of a lost worker until their lease lapses.
        running = sum(w.busy for w in workers)
        return self.page(request, "overview", queues=queues, workers=workers, totals=totals,
                         hour=hour, minute=minute, running=running,
                         slots=sum(w.concurrency for w in workers),
                         leased=max(totals["active"] - running, 0))

    async def queue(self, request: Request) -> Response:
        name = request.path_params["queue"]
        state = request.query_params.get("state") or "pending"
        if state not in TASK_STATES:
            raise ValueError(f"state must be one of {', '.join(TASK_STATES)}")
        offset = _int(request.query_params.get("offset"), "offset")
        task_type = request.query_params.get("type", "").strip() or None
        info = await self.inspector.queue(name)
        tasks = await self.inspector.tasks(name, state, PAGE_SIZE, offset, task_type)
        groups = await self.inspector.groups(
            name, PAGE_SIZE, _int(request.query_params.get("goffset"), "goffset"),
            _int(request.query_params.get("boffset"), "boffset"))
        return self.page(request, "queue", queue=info, tasks=tasks, state=state, groups=groups)

    async def group(self, request: Request) -> Response:
        """The tasks waiting in one group, a page at a time."""
        name, params = request.path_params["queue"], request.query_params
        task_type, group = params.get("type", ""), params.get("group", "")
        if not task_type or not group:
            raise ValueError("a group is named by its task type and name (?type=&group=)")
        info = await self.inspector.queue(name)
        tasks = await self.inspector.group_tasks(name, task_type, group, PAGE_SIZE,
                                                 _int(params.get("offset"), "offset"))
        return self.page(request, "group", queue=info, tasks=tasks, group=group)

    async def task(self, request: Request) -> Response:
        detail = await self.inspector.task(request.path_params["task_id"],
                                           request.query_params.get("queue") or None)
        return self.page(request, "task", task=detail,
                         trace=trace_link(self.trace_url, detail.headers))

    async def workers(self, request: Request) -> Response:
        return self.page(request, "workers", workers=await self.inspector.workers())

    async def schedules(self, request: Request) -> Response:
        return self.page(request, "schedules", schedules=await self.inspector.schedules())

    async def flows(self, request: Request) -> Response:
        total, flows = await self.inspector.flows(PAGE_SIZE)
        return self.page(request, "flows", total=total, flows=flows, flow_styles=FLOW_STYLES)

    async def flow(self, request: Request) -> Response:
        flow = await self.inspector.flow(request.path_params["flow_id"])
        return self.page(request, "flow", flow=flow, flow_styles=FLOW_STYLES,
                         step_styles=STEP_STYLES)

    async def search(self, request: Request) -> Response:
        task_id = request.query_params.get("id", "").strip()
        if not task_id:
            return RedirectResponse(request.url_for("overview"), 303)
        detail = await self.inspector.task(task_id, request.query_params.get("queue") or None)
        return RedirectResponse(_task_url(request, detail.id, detail.queue), 303)

    # -- signing in -----------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        return self.page(request, "login", error=None, next=_next(request.query_params))

    async def login(self, request: Request) -> Response:
        form = await request.form()
        if not self.auth.can_act:
            return self.page(request, "login", 403, error="This console is read-only.",
                             next="/")
        if not self.auth.token_ok(_field(form, "token")):
            return self.page(request, "login", 403, error="That is not the console's token.",
                             next=_next(form))
        response = RedirectResponse(_next(form), 303)
        response.set_cookie(SESSION_COOKIE, self.auth.new_session(), max_age=SESSION_SECONDS,
                            httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")
        return response

    async def logout(self, request: Request) -> Response:
        response = RedirectResponse(request.url_for("overview"), 303)
        response.delete_cookie(SESSION_COOKIE)
        return response

    # -- actions --------------------------------------------------------------------------

    async def queue_action(self, request: Request) -> Response:
        queue, action = request.path_params["queue"], request.path_params["action"]
        i = self.inspector

        async def run(form: FormData) -> str:
            state = _field(form, "state")
            if action in ("pause", "unpause"):
                await (i.pause if action == "pause" else i.unpause)(queue)
                return f"Queue {queue} {action}d."
            if action == "requeue":
                done = await i.requeue(queue, state or "dead")
                return f"Moved {done.moved:,} {done.state} task(s) of {queue} to pending."
            if action == "purge":
                return f"Deleted {await i.purge(queue, state):,} {state} task(s) of {queue}."
            raise ValueError(f"no action {action!r} on a queue")

        back = _queue_url(request, queue)
        return await self.act(request, run, back)

    async def task_action(self, request: Request) -> Response:
        task_id, action = request.path_params["task_id"], request.path_params["action"]
        i = self.inspector
        form = await request.form()
        queue = _field(form, "queue") or None
        after = _task_url(request, task_id, queue)

        async def run(form: FormData) -> str:
            nonlocal after
            detail = await i.task(task_id, queue)
            if action == "requeue":
                if detail.state not in REVIVABLE or (await i.requeue(
                        detail.queue, detail.state, [task_id])).missing:
                    raise ValueError(f"task {task_id} is {detail.state}: it cannot be requeued")
                if not detail.options.get("retention"):  # gone once it runs: see its queue
                    after = _queue_url(request, detail.queue) + "?state=pending"
                return f"Task {task_id} moved from {detail.state} to pending."
            if action == "delete":
                await i.delete(task_id, detail.queue)
                return f"Task {task_id} deleted (it was {detail.state})."
            if action == "cancel":
                state = await i.cancel(task_id, detail.queue)
                return {"cancelled": f"Task {task_id} cancelled.",
                        "running": f"Task {task_id} is being stopped by its worker."}.get(
                            state, f"Task {task_id} had ended already ({state}).")
            raise ValueError(f"no action {action!r} on a task")

        return await self.act(request, run, lambda: after)

    async def act(self, request: Request, run: Callable[[FormData], Awaitable[str]],
                  back: str | Callable[[], str]) -> Response:
        """Run an action if the request may: POST from this site with the session's CSRF
        token, or with the bearer token. The outcome is shown on the page it returns to
        (`back`, or what it says once the action ran)."""
        form = await request.form()
        origin = request.headers.get("origin")
        authorization = request.headers.get("authorization")
        scripted = authorization is not None  # a browser never sends one by itself
        if not self.auth.can_act:
            return self.refuse(request, "This console is read-only: actions need a token "
                               "(obsq ui --token, or OBSQ_UI_TOKEN) and no --read-only.",
                               scripted)
        if origin and origin != "null" and urlsplit(origin).netloc != request.headers.get("host"):
            return self.refuse(request, "Actions are only accepted from the console itself.",
                               scripted)
        by_script = self.auth.bearer_ok(authorization)
        if scripted and not by_script:
            return self.refuse(request, "The bearer token is not the console's token.", True)
        if not (by_script or
                self.auth.csrf_ok(request.cookies.get(SESSION_COOKIE), _field(form, "csrf"))):
            return self.refuse(request, "Sign in with the console's token to do this.")
        try:
            kind, message = "ok", await run(form)
        except Refused as exc:
            if by_script:  # a script reads the status, not a page it is sent back to
                return JSONResponse({"status": "error", "message": str(exc)},
                                    _refusal_status(exc))
            kind, message = "error", str(exc)
        if by_script:
            return JSONResponse({"status": "ok", "message": message})
        response = RedirectResponse(_next(form, back() if callable(back) else back), 303)
        response.set_cookie(FLASH_COOKIE, quote(f"{kind}:{message}"), max_age=60,
                            httponly=True, samesite="strict")
        return response

    def refuse(self, request: Request, message: str, scripted: bool = False) -> Response:
        """403: as JSON to a script (it sent an Authorization header), else a page."""
        if scripted:
            return JSONResponse({"status": "error", "message": message}, 403)
        return self.page(request, "error", 403, title="Not allowed", message=message)

    # -- errors ---------------------------------------------------------------------------

    async def not_found(self, request: Request, exc: Exception) -> Response:
        return self.page(request, "error", 404, title="Not found", message=str(exc))

    async def unavailable(self, request: Request, exc: Exception) -> Response:
        return self.page(request, "error", 503, title="Redis is unreachable", message=str(exc))

    async def bad_request(self, request: Request, exc: Exception) -> Response:
        return self.page(request, "error", 400, title="Bad request", message=str(exc))

    # -- probes and metrics ---------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})  # answering means the event loop runs

    async def readyz(self, request: Request) -> Response:
        try:
            await asyncio.wait_for(self.inspector.queue_names(), READY_TIMEOUT)
        except (BrokerError, asyncio.TimeoutError) as exc:
            reason = f"Redis: {exc or 'no answer within the timeout'}"
            return JSONResponse({"status": "unavailable", "reason": reason}, 503)
        return JSONResponse({"status": "ok"})

    async def metrics(self, request: Request) -> Response:
        """This process's metrics and the queue gauges, as the worker's endpoint has them."""
        if self._registry is None:
            from obsq.observability.collector import QueueCollector
            from obsq.observability.metrics import endpoint_registry

            broker = self.inspector.broker
            self._registry = endpoint_registry(QueueCollector(
                broker, asyncio.get_running_loop(), broker.queues))
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        body = await asyncio.to_thread(encoder, self._registry)  # the collector needs the
        return Response(body, media_type=content_type)  # loop free to read Redis

    # -- rendering ------------------------------------------------------------------------

    def page(self, request: Request, name: str, status: int = 200, **values: Any) -> Response:
        fragment = request.headers.get(FRAGMENT_HEADER) == "1"
        session = request.cookies.get(SESSION_COOKIE)
        signed_in = self.auth.session_ok(session)
        flash = None if fragment else request.cookies.get(FLASH_COOKIE)
        kind, _, message = unquote(flash or "").partition(":")
        context = {"namespace": self.inspector.namespace, "can_act": self.auth.can_act,
                   "signed_in": signed_in, "csrf": self.auth.csrf_token(session or "")
                   if signed_in else "", "flash": (kind, message) if flash else None,
                   "fragment": fragment, "page": name, "states": TASK_STATES, **values}
        response = self.templates.TemplateResponse(request, f"{name}.html", context,
                                                   status_code=status)
        response.headers["cache-control"] = "no-store"
        if flash:
            response.delete_cookie(FLASH_COOKIE)
        return response


def _task_url(request: Request, task_id: str, queue: str | None = None) -> str:
    """A task's page, its id escaped whole: ids may hold '/', '?', '#' or '%' (url_for
    leaves them as they are, and the browser then reads a path, a query or a fragment)."""
    return (f"{request.base_url}tasks/{quote(task_id, safe='')}"
            + (f"?{urlencode({'queue': queue})}" if queue else ""))


def _queue_url(request: Request, queue: str) -> str:
    return f"{request.base_url}queues/{quote(queue, safe='')}"


def _field(form: FormData, name: str) -> str:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


def _refusal_status(exc: Exception) -> int:
    if isinstance(exc, (QueueNotFound, TaskNotFound)):
        return 404
    return 409 if isinstance(exc, TaskRunning) else 400


def _next(source: Any, default: str = "/") -> str:
    """Where to go after a form: a path on this site only (never '//host' or a URL)."""
    target = source.get("next") if source is not None else None
    if isinstance(target, str) and target.startswith("/") and not target.startswith("//") \
            and "\\" not in target:
        return target
    return default


def _int(raw: str | None, name: str) -> int:
    try:
        value = int(raw or 0)
    except ValueError:
        raise ValueError(f"{name} must be a whole number") from None
    if value < 0:
        raise ValueError(f"{name} must not be negative")
    return value
