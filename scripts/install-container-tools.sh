#!/usr/bin/env bash
# Install what tests/containers needs to build and check the images: podman and debootstrap, from
# Debian's packages (apt-get, as root). On failure prints one line saying why and exits 1; .ci/run
# hands that line to the tests, which then skip with it instead of passing.
set -uo pipefail
if command -v podman >/dev/null && command -v debootstrap >/dev/null; then
    exit 0
fi
if [[ $(id -u) != 0 ]]; then
    echo "not root: cannot apt-get install podman debootstrap"
    exit 1
fi
if ! command -v apt-get >/dev/null; then
    echo "no apt-get on this machine: install podman and debootstrap by hand"
    exit 1
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman debootstrap; } \
    >"$log" 2>&1; then
    echo "apt-get install podman debootstrap failed: $(grep -E '^(E|W):' "$log" | tail -1)"
    exit 1
fi
