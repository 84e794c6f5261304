# syntax=docker/dockerfile:1
#
# The obsq worker image. Build your application image on it:
#
#   FROM obsq:0.1.0
#   COPY --chown=10001:10001 myproject/ /app/myproject/
#   CMD ["worker", "myproject.tasks:app"]
#
# The entry point is the `obsq` command, so `docker run IMAGE worker myproject.tasks:app`
# or the Helm chart's `obsq worker <app>` start a worker; /app (the working directory)
# is on the import path.

ARG PYTHON_VERSION=3.11

# --- build: the obsq wheel and the wheels of its dependencies ---------------------------
FROM python:${PYTHON_VERSION}-slim AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY obsq ./obsq
RUN pip wheel --wheel-dir /wheels .

# --- runtime: only the installed wheels, no build tools, not root -----------------------
FROM python:${PYTHON_VERSION}-slim

ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="obsq" \
      org.opencontainers.image.description="Redis task queue and worker for Python, built for Kubernetes" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The wheels are mounted from the build stage for this one step, so they do not end
# up in a layer of the image.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels obsq \
    && groupadd --system --gid 10001 obsq \
    && useradd --system --uid 10001 --gid 10001 --home-dir /app --no-create-home \
        --shell /usr/sbin/nologin obsq \
    && mkdir -p /app \
    && chown 10001:10001 /app

WORKDIR /app
# Numeric, so that Kubernetes' runAsNonRoot can check it without /etc/passwd.
USER 10001:10001

# /metrics, /healthz and /readyz (OBSQ_HTTP_PORT).
EXPOSE 9191
# A worker drains on SIGTERM: it stops fetching, lets running tasks finish for
# OBSQ_SHUTDOWN_TIMEOUT seconds and hands the rest back to Redis.
STOPSIGNAL SIGTERM

ENTRYPOINT ["obsq"]
CMD ["worker", "--help"]
