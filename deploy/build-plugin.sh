#!/usr/bin/env bash
# Build gpu-alloc as a Docker managed plugin: OUT/config.json + OUT/rootfs/.
#
# Usage: deploy/build-plugin.sh [--out DIR] [--image IMAGE] [--base IMAGE] [--dry-run]
#   --out DIR      plugin directory to (re)build (default: <checkout>/build/plugin)
#   --image IMAGE  export this image, which must hold the venv at /opt/gpu-alloc/venv,
#                  instead of building one
#   --base IMAGE   base for the image built here (default python:3.11-slim-bookworm)
#   --dry-run      print the steps, change nothing
# (Makefile target: `plugin: ; deploy/build-plugin.sh --out build/plugin`.)
#
# The root filesystem is a `docker export` of a container, so this needs a running
# Docker Engine (and, without --image, the base image or network access to pull it).
# Where there is none, it stops and says so: it never writes a partial rootfs.
#
# Then, on the GPU host:
#   docker plugin create gpu-alloc build/plugin && docker plugin enable gpu-alloc
# and "authorization-plugins": ["gpu-alloc"] in daemon.json, as for the systemd install.
# Use EITHER this managed plugin OR the gpu-alloc-plugin systemd unit, never both.
# The host's NVML library is bind-mounted from a Debian/Ubuntu path; elsewhere, before
# enabling:  docker plugin set gpu-alloc libnvidia-ml.source=/usr/lib64/libnvidia-ml.so.1
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SOURCE=$(dirname "$SCRIPT_DIR")
OUT=$SOURCE/build/plugin
IMAGE=""
BASE=python:3.11-slim-bookworm
DRY_RUN=0
TAG=gpu-alloc-plugin-rootfs:latest
ENTRYPOINT=/opt/gpu-alloc/venv/bin/gpu-alloc

die() {
    printf 'build-plugin.sh: error: %s\n' "$*" >&2
    exit 1
}
act() {
    printf '    + %s\n' "$*"
    [[ $DRY_RUN == 1 ]] || "$@"
}

while (($#)); do
    case $1 in
    --out) OUT=${2:?--out needs a directory}; shift ;;
    --image) IMAGE=${2:?--image needs an image}; shift ;;
    --base) BASE=${2:?--base needs an image}; shift ;;
    --dry-run) DRY_RUN=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1" ;;
    esac
    shift
done

[[ -f $SOURCE/config.json ]] || die "$SOURCE/config.json (the plugin manifest) is missing"
if ! command -v docker >/dev/null || ! timeout 20 docker info >/dev/null 2>&1; then
    die "no Docker Engine reachable: the plugin root filesystem is built by exporting a" \
        "container, which needs one. config.json alone is not a plugin. Build on a host" \
        "with Docker, or use the systemd install (deploy/install.sh)."
fi

if [[ -z $IMAGE ]]; then
    IMAGE=$TAG
    printf '==> image %s (venv at /opt/gpu-alloc/venv, from %s)\n' "$IMAGE" "$BASE"
    ctx=$(mktemp -d)
    trap 'rm -rf "$ctx"' EXIT
    # Only what pip needs: no .venv, .git or build output in the build context.
    act tar -C "$SOURCE" --exclude=./.venv --exclude=./.git --exclude=./build \
        --exclude=__pycache__ -cf "$ctx/src.tar" .
    cat >"$ctx/Dockerfile" <<EOF
FROM $BASE
ADD src.tar /src/
RUN python3 -m venv /opt/gpu-alloc/venv \\
 && /opt/gpu-alloc/venv/bin/pip install --no-cache-dir --disable-pip-version-check /src \\
 && rm -rf /src
EOF
    act docker build -t "$IMAGE" "$ctx"
fi

printf '==> rootfs: docker export of a container from %s\n' "$IMAGE"
if [[ $DRY_RUN == 1 ]]; then
    printf '    + docker create %s; docker export ... | tar -x -C %s/rootfs\n' "$IMAGE" "$OUT"
else
    cid=$(docker create "$IMAGE" /bin/true)
    rm -rf "$OUT.tmp"
    mkdir -p "$OUT.tmp/rootfs"
    if ! docker export "$cid" | tar -x -C "$OUT.tmp/rootfs"; then
        docker rm -f "$cid" >/dev/null
        rm -rf "$OUT.tmp"
        die "docker export of $IMAGE failed"
    fi
    docker rm -f "$cid" >/dev/null
    [[ -x $OUT.tmp/rootfs$ENTRYPOINT ]] || {
        rm -rf "$OUT.tmp"
        die "$IMAGE has no $ENTRYPOINT (the manifest's entrypoint)"
    }
    cp "$SOURCE/config.json" "$OUT.tmp/config.json"
    rm -rf "$OUT"
    mv "$OUT.tmp" "$OUT"
fi
printf '==> %s ready:\n    docker plugin create gpu-alloc %s\n    docker plugin enable gpu-alloc\n' \
    "$OUT" "$OUT"
