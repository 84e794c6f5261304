# syntax=docker/dockerfile:1
#
# The obsq worker image. Build your application image on it:
#
#   FROM obsq:0.1.0
#   COPY myproject/ /app/myproject/
#   CMD ["worker", "myproject.tasks:app"]
#
# The entry point is the `obsq` command, so `docker run IMAGE worker myproject.tasks:app`
# or the Helm chart's `obsq worker <app>` start a worker; /app (the working directory)
# is on the import path. Code copied as above belongs to root: the worker (UID 10001)
# reads it and cannot change it.
#
# Build arguments: PYTHON_VERSION (3.11) picks the python:<version>-slim base and
# PYTHON_DIGEST (sha256:...) pins it by digest, so that a rebuild gets the same base; or
# BASE_IMAGE names another base with python, pip and bash (name@sha256:... pins it too).
# VERSION, SOURCE, REVISION (the commit) and CREATED (RFC 3339) fill the OCI labels:
#
#   docker build --build-arg PYTHON_DIGEST=sha256:... --build-arg REVISION="$(git rev-parse HEAD)" \
#       --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" -t obsq:0.1.0 .

ARG PYTHON_VERSION=3.11
ARG PYTHON_DIGEST=""
ARG BASE_IMAGE=python:${PYTHON_VERSION}-slim${PYTHON_DIGEST:+@}${PYTHON_DIGEST}

# --- build: the obsq wheel and the wheels of its dependencies ---------------------------
FROM ${BASE_IMAGE} AS build

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Each list names wheels with their hashes: the runtime stage installs exactly these, and
# copying a list there ties that stage's layer cache to the wheels' contents.
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
# The dependencies, built from pyproject.toml and an empty package with its version (which
# pyproject.toml reads): only a change of either rebuilds this layer and the one that
# installs them. The extras: OTLP export (tracing.enabled), the console, uvloop.
COPY obsq/_version.py obsq/
RUN touch obsq/__init__.py \
    && pip wheel --wheel-dir /wheels/dependencies ".[otlp,ui,uvloop]" \
    && rm -rf obsq build obsq.egg-info /wheels/dependencies/obsq-*.whl \
    && sha256sum /wheels/dependencies/*.whl \
        | awk '{ print $2 " --hash=sha256:" $1 }' > /wheels/dependencies.txt
COPY obsq ./obsq
RUN pip wheel --no-deps --wheel-dir /wheels/obsq . \
    && sha256sum /wheels/obsq/*.whl | awk '{ print $2 " --hash=sha256:" $1 }' > /wheels/obsq.txt

# --- runtime: only the installed wheels, no build tools, not root -----------------------
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The wheels are mounted from the build stage for the steps that install them, so they
# do not end up in a layer of the image; the lists stay, as a record of what is in it.
COPY --from=build /wheels/dependencies.txt /usr/local/share/obsq/
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --require-hashes --requirement /usr/local/share/obsq/dependencies.txt \
    && groupadd --gid 10001 obsq \
    && useradd --uid 10001 --gid 10001 --home-dir /app --no-create-home --no-log-init \
        --shell /usr/sbin/nologin obsq \
    && mkdir -p /app \
    && chown 10001:10001 /app
COPY --from=build /wheels/obsq.txt /usr/local/share/obsq/
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --no-deps --require-hashes --requirement /usr/local/share/obsq/obsq.txt \
    && pip check

WORKDIR /app
# Numeric, so that Kubernetes' runAsNonRoot can check it without /etc/passwd.
USER 10001:10001

# /metrics, /healthz and /readyz (OBSQ_HTTP_PORT).
EXPOSE 9191
# A worker drains on SIGTERM: it stops fetching, lets running tasks finish for
# OBSQ_SHUTDOWN_TIMEOUT seconds and hands the rest back to Redis (give `docker stop -t`
# or compose's stop_grace_period more than that).
STOPSIGNAL SIGTERM

# For plain Docker and compose (Kubernetes ignores it and uses the chart's probes): ask the
# process's own /healthz, with python as there is no curl. The port is OBSQ_HTTP_PORT, else
# the command's default (worker 9191, scheduler 9192, exporter 9193; the console's
# OBSQ_UI_PORT, 8181), read from the command line of the container's first process.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 CMD ["python", "-c", "import os, urllib.request; cmd = open('/proc/1/cmdline', 'rb').read().split(b'\\0'); port = os.environ.get('OBSQ_UI_PORT', '8181') if b'ui' in cmd else os.environ.get('OBSQ_HTTP_PORT') or ('9192' if b'scheduler' in cmd else '9193' if b'exporter' in cmd else '9191'); urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=4)"]

ENTRYPOINT ["obsq"]
CMD ["worker", "--help"]

ARG VERSION=0.1.0
ARG SOURCE=https://github.com/obsq/obsq
ARG REVISION=""
ARG CREATED=""
LABEL org.opencontainers.image.title="obsq" \
      org.opencontainers.image.description="Redis task queue and worker for Python, built for Kubernetes" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.documentation="https://obsq.readthedocs.io/en/latest/"
