"""The code blocks of the README and of the site (tests/pages.py finds them) run here, as a
user would run them, so that the pages cannot rot: the Python blocks with checks of their
own as the files of a small project against a real Redis (the only change is the Redis
address; tests/test_docs.py runs the others), and each shell command by what it is. A
command the suite does not know how to run fails
`test_every_shell_command_is_run_by_this_suite`."""

from __future__ import annotations

import importlib.metadata
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from pages import PAGE_URL, python_block, shell_commands
from support import ROOT, missing_tool, obsq_env, wait_for

import obsq


def run(args: list[str], **options) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL, **options)
    assert result.returncode == 0, f"{shlex.join(args)}\n{result.stdout}\n{result.stderr}"
    return result


# -- the project of the Use section ---------------------------------------------------------


@pytest.fixture
def project(tmp_path: Path, redis_url: str) -> Path:
    package = tmp_path / "myproject"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tasks.py").write_text(python_block('app = obsq.App(namespace="myproject")'))
    (tmp_path / "produce.py").write_text(
        python_block("asyncio.run(main())\n\nwith obsq.SyncClient(").replace(PAGE_URL, redis_url))
    return tmp_path


@pytest.fixture
def readme_worker(project: Path, redis_url: str) -> Iterator[subprocess.Popen[str]]:
    (command,) = [c for c in shell_commands() if c.startswith("obsq worker myproject.")]
    log = (project / "worker.log").open("w")
    worker = subprocess.Popen(shlex.split(command), cwd=project, stdout=log,
                              stderr=subprocess.STDOUT, text=True,
                              env=obsq_env(OBSQ_REDIS_URL=redis_url, OBSQ_HTTP_PORT="0"))
    try:
        wait_for(lambda: "started: queues critical=6,default=3" in
                 (project / "worker.log").read_text(), timeout=30, what="the worker starting")
        yield worker
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        log.close()


def test_the_use_section_runs_as_written(project, readme_worker, redis_url) -> None:
    produced = run([sys.executable, "produce.py"], cwd=project,
                   env=obsq_env(OBSQ_REDIS_URL=redis_url))
    assert produced.stdout.splitlines() == [
        "{'sent_to': 'a@b.c'}", "completed", "scheduled", "2", "report for 12",
        "report for 12", "default"]


def test_the_console_section_runs_as_written(project, readme_worker, redis_url) -> None:
    produce = ("import asyncio, obsq\n"
               "from myproject.tasks import app\n"
               "async def main():\n"
               f"    async with obsq.Client({redis_url!r}, app=app) as client:\n"
               "        info = await client.enqueue('email:send', {'to': 'a@b.c'}, retention=60)\n"
               "        await client.result(info, timeout=10)\n"
               "asyncio.run(main())\n")
    run([sys.executable, "-c", produce], cwd=project, env=obsq_env(OBSQ_REDIS_URL=redis_url))
    (project / "look.py").write_text(
        python_block("obsq.Inspector(").replace(PAGE_URL, redis_url))
    out = run([sys.executable, "look.py"], cwd=project,
              env=obsq_env(OBSQ_REDIS_URL=redis_url)).stdout
    assert out.splitlines()[0].startswith("critical {'pending': 0")
    assert "email:send {'sent_to': 'a@b.c'}" in out and out.endswith("requeued 0\n")


def test_the_limits_section_runs_as_written(project, redis_url) -> None:
    (project / "control.py").write_text(
        python_block("ordering_key=\"acct-42\"").replace(PAGE_URL, redis_url))
    out = run([sys.executable, "control.py"], cwd=project,
              env=obsq_env(OBSQ_REDIS_URL=redis_url)).stdout.splitlines()
    assert out == ["['acct-42 step 0', 'acct-42 step 1', 'acct-42 step 2']", "running",
                   "cancelled"]


def test_the_groups_and_events_section_runs_as_written(project, redis_url) -> None:
    (project / "fan.py").write_text(python_block("app.aggregate(").replace(PAGE_URL, redis_url))
    out = run([sys.executable, "fan.py"], cwd=project,
              env=obsq_env(OBSQ_REDIS_URL=redis_url)).stdout.splitlines()
    assert out == ["aggregating", "['order.created@billing', 'order.created@email']",
                   "['billing 42', 'email 42', 'sensor-1 [0, 1, 2]', 'sensor-1 [3, 4]']"]


def test_the_bytes_section_runs_as_written(project, redis_url) -> None:
    (project / "blobs.py").write_text(python_block("blob:store").replace(PAGE_URL, redis_url))
    out = run([sys.executable, "blobs.py"], cwd=project,
              env=obsq_env(OBSQ_REDIS_URL=redis_url)).stdout.splitlines()
    assert out == ["10000", "b'x\\x9c'"]


def test_the_schedules_section_runs_as_written(project, redis_url) -> None:
    (command,) = [c for c in shell_commands() if c.startswith("obsq scheduler ")]
    (listing,) = [c for c in shell_commands() if c.startswith("obsq schedules ")]
    env = obsq_env(OBSQ_REDIS_URL=redis_url)
    log_path = project / "scheduler.log"
    with log_path.open("w") as log:
        scheduler = subprocess.Popen(shlex.split(command), cwd=project, stdout=log,
                                     stderr=subprocess.STDOUT, env={**env, "OBSQ_HTTP_PORT": "0"})
    try:
        wait_for(lambda: "schedule report:nightly (0 3 * * *, report:nightly) written"
                 in log_path.read_text(), timeout=30, what="the App's entry written")
        (project / "plan.py").write_text(
            python_block("client.schedule(").replace(PAGE_URL, redis_url))
        *listed, removed = run([sys.executable, "plan.py"], cwd=project,
                               env=env).stdout.splitlines()
        assert sorted(listed) == ["acme-monthly-report 0 6 1 * * America/New_York skip client",
                                  "ops-digest @every 30s UTC once client",
                                  "report:nightly 0 3 * * * Europe/Paris once app"]
        assert removed == "True"
        out = run(shlex.split(listing), cwd=project, env=env).stdout
        assert "acme-monthly-report" in out and "report:nightly" in out
        assert "ops-digest" not in out
    finally:
        scheduler.terminate()
        assert scheduler.wait(timeout=30) == 0, log_path.read_text()


# -- the shell commands, each by what it is --------------------------------------------------


def install_and_demo(command: str, redis_url: str) -> None:
    """A venv (system Pythons refuse installs), obsq installed in it, the demo; the suite
    runs in such an environment already."""
    assert command.split(" && ") == ["python3 -m venv .venv", ". .venv/bin/activate",
                                     "pip install -e .", "obsq demo"]
    # run as written, shortened, on the test's Redis:
    out = run(["obsq", "demo", "--duration", "2", "--http-port", "0"], cwd=ROOT,
              env=obsq_env(OBSQ_REDIS_URL=redis_url)).stdout
    assert "dead     payment:charge" in out


def ci_run(command: str, redis_url: str) -> None:
    assert command == "bash .ci/run"  # this suite is that command's last step, on each Python:
    steps = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    loop = steps[steps.index('for i in "${!PYTHONS[@]}"; do'):]
    assert loop[-2].endswith(" && python3 -m pytest -q -n auto)") and loop[-1] == "done"
    assert "`python3 -m pytest -q -n auto`" in (ROOT / "README.md").read_text()


def worker(command: str, redis_url: str) -> None:
    """Run with the Use section's project: test_the_use_section_runs_as_written."""
    assert command.startswith("obsq worker myproject.tasks:app")


def scheduler(command: str, redis_url: str) -> None:
    """Run with the Use section's project: test_the_schedules_section_runs_as_written."""
    assert command == "obsq scheduler myproject.tasks:app"


def schedules(command: str, redis_url: str) -> None:
    """`obsq schedules` as written, on the test's Redis (whatever it holds)."""
    out = run(shlex.split(command), cwd=ROOT, env=obsq_env(OBSQ_REDIS_URL=redis_url)).stdout
    assert out.startswith(("schedule ", "no schedules in namespace 'myproject'"))


def groups(command: str, redis_url: str) -> None:
    """`obsq groups` as written, on the test's Redis, with a task waiting in a group of the
    README's namespace (taken out again, so the groups section's run finds none)."""
    args = shlex.split(command)
    with obsq.SyncClient(redis_url, namespace=args[args.index("--namespace") + 1]) as client:
        info = client.enqueue("readings:add", 7, group="sensor-9")
        try:
            out = run(args, cwd=ROOT, env=obsq_env(OBSQ_REDIS_URL=redis_url)).stdout
        finally:
            client.delete(info.id)
    header, row = out.splitlines()[:2]
    assert header.split() == ["type", "group", "size", "oldest", "idle"]
    assert row.split()[:3] == ["readings:add", "sensor-9", "1"]


def console(command: str, redis_url: str) -> None:
    """`obsq ui` as written, on a free port of the test's Redis, until it serves a page."""
    import httpx

    from obsq.redis_server import free_port

    args = shlex.split(command)
    port = free_port()
    args[args.index("--http-port") + 1] = str(port)
    process = subprocess.Popen(args, cwd=ROOT, env=obsq_env(OBSQ_REDIS_URL=redis_url),
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/", timeout=1).status_code == 200,
                 timeout=30, what="obsq ui serving its overview")
    finally:
        process.terminate()
        process.wait(timeout=10)


def export_otel(command: str, redis_url: str) -> None:
    env = obsq_env(OBSQ_REDIS_URL=redis_url, OTEL_EXPORTER_OTLP_TIMEOUT="1")
    env.update(assignment.split("=", 1) for assignment in shlex.split(command)[1:])
    out = run([sys.executable, "-c", "from obsq.observability import setup_tracing; "
               "print(setup_tracing())"], env=env).stdout
    assert out.strip() == "True"


def export_obsq(command: str, redis_url: str) -> None:
    """The variables every command reads: with them exported as written (the test's Redis
    for the page's), `obsq queues` without a flag looks at that namespace."""
    env = obsq_env()
    env.update(assignment.split("=", 1) for assignment in shlex.split(command)[1:])
    assert set(env) >= {"OBSQ_REDIS_URL", "OBSQ_NAMESPACE"}
    env["OBSQ_REDIS_URL"] = env["OBSQ_REDIS_URL"].replace(PAGE_URL, redis_url)
    out = run([sys.executable, "-m", "obsq", "queues"], cwd=ROOT, env=env).stdout
    assert f"namespace {env['OBSQ_NAMESPACE']!r}" in out or out.startswith("queue "), out


def kubectl_exec(command: str, redis_url: str) -> None:
    """`kubectl exec` of an obsq command in a pod, which has OBSQ_REDIS_URL and
    OBSQ_NAMESPACE set by the chart: here the command after `--` with them set alike (the
    test's Redis, a namespace holding a dead task in `default`), and no flag."""
    args = shlex.split(command)
    assert args[:3] == ["kubectl", "-n", "jobs"] and args[3] == "exec"
    obsq_args = args[args.index("--") + 1:]
    assert obsq_args[0] == "obsq"
    namespace = f"t{uuid.uuid4().hex[:10]}"
    with obsq.SyncClient(redis_url, namespace=namespace) as client:
        info = client.enqueue("page:example", retention=60)
        try:
            out = run([sys.executable, "-m", "obsq", *obsq_args[1:]], cwd=ROOT, env=obsq_env(
                OBSQ_REDIS_URL=redis_url, OBSQ_NAMESPACE=namespace)).stdout
        finally:
            client.delete(info.id)
    assert "default" in out, out


def kubectl(command: str, redis_url: str) -> None:
    if not shutil.which("kubectl"):
        missing_tool("kubectl is not on PATH (.ci/install-tools.sh installs it)")
    run([*shlex.split(command), "--dry-run=client", "-o", "yaml"], cwd=ROOT)


def helm_upgrade(command: str, redis_url: str) -> None:
    helm = shutil.which("helm") or str(ROOT / ".cache" / "bin" / "helm")
    if not Path(helm).exists():
        missing_tool("helm is not installed (.ci/install-tools.sh installs it)")
    args = shlex.split(command)
    assert args[:3] == ["helm", "upgrade", "--install"]
    run([helm, "template", *args[3:], "--api-versions", "monitoring.coreos.com/v1"],
        cwd=ROOT)


def image_build(command: str, redis_url: str) -> None:
    """The image is built, linted and smoke-tested by .ci/image.sh, a step of `bash
    .ci/run`; here: the command builds the repository's Dockerfile as the chart's default
    image, obsq:<version>, and podman in the docker format (OCI images have no SHELL)."""
    args = shlex.split(command, comments=True)
    assert args[1] == "build" and args[-1] == "."
    assert args[args.index("-t") + 1] == f"obsq:{obsq.__version__}"
    if args[0] == "podman":
        assert args[args.index("--format") + 1] == "docker"
    assert "\nbash .ci/image.sh\n" in (ROOT / ".ci" / "run").read_text()


def acl(command: str, redis_url: str) -> None:
    """`obsq acl` prints the rule the ACL tests check (tests/test_acl.py)."""
    from obsq.broker.acl import acl_rule

    out = run(shlex.split(command), cwd=ROOT, env=obsq_env()).stdout
    assert out == acl_rule("myproject") + "\n"


def redis_cli_acl(command: str, redis_url: str) -> None:
    """The user of the rule, made on the test's Redis as written, then removed."""
    if not shutil.which("redis-cli"):
        missing_tool("redis-cli is not on PATH")
    assert command.startswith("redis-cli ACL SETUSER obsq on ")
    with_url = command.replace("redis-cli ", f"redis-cli -u {shlex.quote(redis_url)} ", 1)
    try:
        out = run(["bash", "-c", with_url], cwd=ROOT, env=obsq_env()).stdout
        assert out.strip() == "OK", out
        user = redis_url.replace("redis://", "redis://obsq:s3cret@", 1)
        as_user = ["redis-cli", "-u", user, "--no-auth-warning"]
        assert run([*as_user, "EXISTS", "myproject:queues"]).stdout.strip() in ("0", "1")
        assert "NOPERM" in run([*as_user, "EXISTS", "elsewhere:queues"]).stdout
        assert "NOPERM" in run([*as_user, "FLUSHALL"]).stdout
    finally:
        subprocess.run(["redis-cli", "-u", redis_url, "ACL", "DELUSER", "obsq"],
                       capture_output=True, timeout=30)


def pytest_example(command: str, redis_url: str) -> None:
    """The testing guide's example tests, which tests/test_testing.py runs as written (with
    obsq's pytest plugin): here, the command names that directory."""
    assert command == "pytest examples/testing"
    assert (ROOT / "examples" / "testing" / "test_tasks.py").is_file()
    assert 'ROOT / "examples" / "testing"' in (ROOT / "tests" / "test_testing.py").read_text()


def pytest_django_example(command: str, redis_url: str) -> None:
    """The Django guide's example tests, which tests/test_django.py runs as written."""
    assert command == "pytest examples/django"
    assert (ROOT / "examples" / "django" / "test_orders.py").is_file()
    assert 'EXAMPLE / "test_orders.py"' in (ROOT / "tests" / "test_django.py").read_text()


def django_worker(command: str, redis_url: str) -> None:
    """The Django guide's worker and its environment, as tests/test_django.py starts them
    (the example's settings module, which reads OBSQ_REDIS_URL)."""
    test = (ROOT / "tests" / "test_django.py").read_text()
    if command.startswith("export "):
        assert "export DJANGO_SETTINGS_MODULE=mysite.settings OBSQ_REDIS_URL=" in command
        assert 'DJANGO_SETTINGS_MODULE="mysite.settings"' in test
        assert "OBSQ_REDIS_URL" in (ROOT / "examples/django/mysite/settings.py").read_text()
    else:
        assert command == "obsq worker obsq.django:app"
        assert '["worker", "obsq.django:app",' in test


def install_extra(command: str, redis_url: str) -> None:
    """`pip install 'obsq[EXTRA]'`: the extra is declared, and what it brings to this Python
    (fastotel needs 3.11) is installed here (.ci/run installs every extra), so the suite runs
    obsq with it."""
    extra = re.search(r"obsq\[(\w+)\]", command)[1]
    assert extra in importlib.metadata.metadata("obsq").get_all("Provides-Extra"), (
        f"obsq has no extra {extra!r}")
    wanted = [Requirement(r) for r in importlib.metadata.requires("obsq") or ()]
    wanted = [r for r in wanted if r.marker and r.marker.evaluate({"extra": extra})]
    for requirement in wanted:
        assert importlib.metadata.version(requirement.name) in requirement.specifier


HANDLERS: dict[str, Callable[[str, str], None]] = {
    "pip install 'obsq[": install_extra,
    "pytest examples/testing": pytest_example,
    "pytest examples/django": pytest_django_example,
    "export DJANGO_SETTINGS_MODULE=": django_worker,
    "obsq worker obsq.django:app": django_worker,
    "obsq acl ": acl,
    "redis-cli ACL SETUSER ": redis_cli_acl,
    "python3 -m venv ": install_and_demo,
    "bash .ci/run": ci_run,
    "obsq worker ": worker,
    "obsq scheduler ": scheduler,
    "obsq schedules ": schedules,
    "obsq groups ": groups,
    "obsq ui ": console,
    "export OTEL_": export_otel,
    "export OBSQ_": export_obsq,
    "kubectl -n jobs exec ": kubectl_exec,
    "kubectl ": kubectl,
    "helm upgrade ": helm_upgrade,
    "docker build ": image_build,
    "podman build ": image_build,
}


def _handler(command: str) -> Callable[[str, str], None] | None:
    return next((h for prefix, h in HANDLERS.items() if command.startswith(prefix)), None)


def test_every_shell_command_is_run_by_this_suite() -> None:
    unknown = [c for c in shell_commands() if _handler(c) is None]
    assert not unknown, f"README commands this suite does not run: {unknown}"


@pytest.mark.parametrize("command", shell_commands())
def test_the_shell_command_runs(command: str, redis_url: str) -> None:
    handler = _handler(command)
    assert handler is not None
    handler(command, redis_url)
