#!/usr/bin/env bash
# Build the xpuspec container images (docker/Dockerfile.cpu, docker/Dockerfile.gpu) from a verified
# edge archive with its wheelhouse, with podman or docker, whichever is present.
#
#   scripts/build-images.sh [options] [cpu|gpu|all]        (default: cpu)
#     --base IMAGE       base image (default python:3.11-slim, pulled from a registry)
#     --offline-base     no registry: make a Debian bookworm base with debootstrap (root; the Debian
#                        package mirror is the only download), cache its tarball and import it
#     --archive FILE     an edge archive to build from (default: made here with `xpuspec bundle --wheels`)
#     --bundle B         the bundle that archive packs (default: the default model; `demo` is the demo pair)
#     --extras E,F       xpuspec extras to add from the package index (e.g. cluster: Ray Serve for KubeRay)
#     --name NAME        image name (default xpuspec): the images are NAME:cpu and NAME:gpu
#     --refresh-base     debootstrap again even when a cached base tarball exists
#     --check            after building, check each image without running a container (podman, root):
#                        tests/containers/chroot_checks.py mounts it and runs xpuspec inside a chroot
# Environment:
#   XPUSPEC_CONTAINER_ENGINE  podman or docker (default: podman when installed, else a reachable docker)
#   XPUSPEC_PODMAN_OPTS       podman's global options, e.g. "--root DIR --runroot DIR --storage-driver vfs"
#   XPUSPEC_BUILD_ISOLATION   podman build --isolation (default chroot: RUN steps need no OCI runtime)
#   XPUSPEC_PIP_CA            a CA bundle for pip inside the build, for --extras behind a TLS-intercepting
#                             proxy (default: $PIP_CERT when set); passed as a build secret, not kept
#   XPUSPEC_PYTHON            the Python that runs `xpuspec bundle` (default .venv/bin/python)
#   XPUSPEC_WHEEL_PLATFORM, XPUSPEC_WHEEL_PYTHON  the wheelhouse's target (default
#                             manylinux_2_36_<machine> and 3.11: Debian bookworm's glibc and Python)
#   DEBIAN_MIRROR             debootstrap's mirror (default: debootstrap's own)
#   XDG_CACHE_HOME            the base tarball is cached in ${XDG_CACHE_HOME:-~/.cache}/xpuspec/images
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

cleanup=()
trap 'rm -rf "${cleanup[@]}"' EXIT
die() { echo "build-images.sh: $*" >&2; exit 1; }
say() { echo "build-images.sh: $*" >&2; }

base=python:3.11-slim
offline_base=0
refresh_base=0
archive=""
bundle=()
name=xpuspec
extras=""
check=0
targets=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --base) base=${2:?--base needs an image}; shift 2 ;;
        --offline-base) offline_base=1; shift ;;
        --refresh-base) refresh_base=1; shift ;;
        --archive) archive=${2:?--archive needs a file}; shift 2 ;;
        --bundle) bundle=("${2:?--bundle needs a bundle}"); shift 2 ;;
        --extras) extras=${2:?--extras needs extra names}; shift 2 ;;
        --name) name=${2:?--name needs a name}; shift 2 ;;
        --check) check=1; shift ;;
        cpu|gpu) targets+=("$1"); shift ;;
        all) targets+=(cpu gpu); shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
[[ ${#targets[@]} -gt 0 ]] || targets=(cpu)

# --- the engine -----------------------------------------------------------------------------------
engine=${XPUSPEC_CONTAINER_ENGINE:-}
if [[ -z $engine ]]; then
    if command -v podman >/dev/null; then
        engine=podman
    elif command -v docker >/dev/null && docker info >/dev/null 2>&1; then
        engine=docker
    else
        die "neither podman nor a running docker engine found (Debian/Ubuntu: apt-get install podman)"
    fi
fi
read -r -a podman_opts <<<"${XPUSPEC_PODMAN_OPTS:-}"
run_engine() {
    if [[ $engine == podman ]]; then podman "${podman_opts[@]}" "$@"; else docker "$@"; fi
}
build_flags=()
if [[ $engine == podman ]]; then
    # docker format keeps HEALTHCHECK (OCI image configs have no field for it).
    # --layers=false commits one layer for the whole build instead of one per step: with the vfs
    # storage driver each commit is a full copy of the filesystem.
    build_flags=(--format docker "--isolation=${XPUSPEC_BUILD_ISOLATION:-chroot}" --layers=false)
fi

# --- the offline base -----------------------------------------------------------------------------
offline_base_image=localhost/xpuspec-base:bookworm
# Debian bookworm, minimal, with Python 3.11 and its venv module: what Dockerfile.cpu needs of a base.
debootstrap_packages=python3,python3-venv,ca-certificates

make_offline_base() {
    local cache=${XDG_CACHE_HOME:-$HOME/.cache}/xpuspec/images
    local tarball=$cache/debian-bookworm-minbase-${debootstrap_packages//,/-}.tar
    if [[ $refresh_base == 1 || ! -s $tarball ]]; then
        [[ $(id -u) == 0 ]] || die "--offline-base runs debootstrap, which needs root"
        command -v debootstrap >/dev/null || die "--offline-base needs debootstrap (apt-get install debootstrap)"
        mkdir -p "$cache"
        local rootfs
        rootfs=$(mktemp -d "$cache/rootfs.XXXXXX")
        cleanup+=("$rootfs" "$rootfs.log" "$tarball.partial")
        chmod 755 "$rootfs"  # the image's / (mktemp made it private: no other user could run anything)
        say "debootstrap bookworm (minbase + $debootstrap_packages) into $rootfs"
        local started=$SECONDS
        debootstrap --variant=minbase --include="$debootstrap_packages" bookworm "$rootfs" \
            ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"} >"$rootfs.log" 2>&1 \
            || { tail -20 "$rootfs.log" >&2; die "debootstrap failed (the log's end is above)"; }
        # What an image needs no copy of: package lists and downloads, documentation.
        rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/usr/share/doc/* \
            "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/tmp/*
        tar -C "$rootfs" --numeric-owner -cf "$tarball.partial" .
        mv "$tarball.partial" "$tarball"
        say "cached the base as $tarball ($((SECONDS - started)) s)"
    else
        say "cached base $tarball"
    fi
    run_engine import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["/bin/bash"]' \
        "$tarball" "$offline_base_image" >/dev/null
    say "imported $offline_base_image"
}

# --- the edge archive -----------------------------------------------------------------------------
context=$(mktemp -d "${TMPDIR:-/tmp}/xpuspec-image-context.XXXXXX")
cleanup+=("$context")
if [[ -n $archive ]]; then
    [[ -f $archive ]] || die "--archive $archive: no such file"
    cp "$archive" "$context/edge.tar.gz"
else
    python=${XPUSPEC_PYTHON:-$repo/.venv/bin/python}
    [[ -x $python ]] || die "$python not found: run scripts/install.sh, or set XPUSPEC_PYTHON"
    platform=${XPUSPEC_WHEEL_PLATFORM:-manylinux_2_36_$(uname -m)}
    say "xpuspec bundle ${bundle[*]:-(default model)} --wheels --platform $platform"
    started=$SECONDS
    (cd "$repo" && "$python" -m xpuspec.cli bundle "${bundle[@]}" -o "$context/edge.tar.gz" --wheels \
        --platform "$platform" --python-version "${XPUSPEC_WHEEL_PYTHON:-3.11}") >&2
    say "made the edge archive ($((SECONDS - started)) s)"
fi
cp "$repo"/docker/Dockerfile.cpu "$repo"/docker/Dockerfile.gpu "$context/"

# --- build ----------------------------------------------------------------------------------------
if [[ $offline_base == 1 ]]; then
    make_offline_base
    base=$offline_base_image
fi
pip_ca=${XPUSPEC_PIP_CA:-${PIP_CERT:-}}
if [[ -n $extras && -n $pip_ca ]]; then
    build_flags+=(--secret "id=pip-ca,src=$pip_ca")
fi
for target in "${targets[@]}"; do
    image=$name:$target
    say "$engine build $image from $base"
    started=$SECONDS
    run_engine build "${build_flags[@]}" -f "$context/Dockerfile.$target" --build-arg "BASE_IMAGE=$base" \
        --build-arg "XPUSPEC_EXTRAS=$extras" -t "$image" "$context" >&2
    size=$(run_engine image inspect --format '{{.Size}}' "$image")
    say "built $image: $((size / 1000000)) MB ($((SECONDS - started)) s)"
    echo "$image $size"
done

if [[ $check == 1 ]]; then
    [[ $engine == podman ]] || die "--check mounts the image with podman; $engine has no image mount"
    for target in "${targets[@]}"; do
        (cd "$repo" && "${XPUSPEC_PYTHON:-$repo/.venv/bin/python}" -m tests.containers.chroot_checks "$name:$target")
    done
fi
