#!/usr/bin/env bash
# Remove gpu-alloc from a Docker host, in the one safe order:
#   1. drop "gpu-alloc" from daemon.json's authorization-plugins (a backup is written first),
#   2. restart (or reload) docker so it stops consulting the plugin,
#   3. stop, disable and delete the units, then the venv.
# Stopping the plugin while dockerd still names it would make Docker refuse every call.
# The state dir and the config stay unless --purge.
#
# Usage: sudo deploy/uninstall.sh [options]
#   --prefix DIR        install root (default /opt/gpu-alloc); PREFIX/venv is removed
#   --keep-venv         leave PREFIX/venv
#   --daemon-json FILE  dockerd's config file (default /etc/docker/daemon.json)
#   --purge             also remove /var/lib/gpu-alloc (leases) and /etc/gpu-alloc
#   --no-restart        edit daemon.json and disable the units, but leave docker and the
#                       plugin running (docker still uses it until restarted); run this
#                       script again after restarting docker to finish
#   --reload            apply daemon.json with `systemctl reload docker` (SIGHUP) instead
#                       of a restart: running containers keep running
#   --force             restart docker even though containers run without live-restore
#   --dry-run           print every action, change nothing
#   DESTDIR=DIR (env)   act on files staged under DIR; no systemctl, no docker
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PREFIX=/opt/gpu-alloc
KEEP_VENV=0
DAEMON_JSON=/etc/docker/daemon.json
PURGE=0
DRY_RUN=0
NO_RESTART=0
RELOAD=0
FORCE=0
DESTDIR=${DESTDIR:-}

CONFIG_DIR=/etc/gpu-alloc
STATE_DIR=/var/lib/gpu-alloc
PLUGIN_SOCK=/run/docker/plugins/gpu-alloc.sock
UNIT_DIR=/etc/systemd/system
UNITS=(gpu-alloc-shim.service gpu-alloc-plugin.service)

SCRIPT_NAME=uninstall.sh
# shellcheck source=deploy/lib.sh
source "$SCRIPT_DIR/lib.sh"

while (($#)); do
    case $1 in
    --prefix) PREFIX=${2:?--prefix needs a directory}; shift ;;
    --keep-venv) KEEP_VENV=1 ;;
    --daemon-json) DAEMON_JSON=${2:?--daemon-json needs a file}; shift ;;
    --purge) PURGE=1 ;;
    --no-restart) NO_RESTART=1 ;;
    --reload) RELOAD=1 ;;
    --force) FORCE=1 ;;
    --dry-run) DRY_RUN=1 ;;
    -h | --help) usage 0 ;;
    *) printf 'uninstall.sh: unknown option %s\n' "$1" >&2; usage 2 >&2 ;;
    esac
    shift
done
[[ $PREFIX == /?* ]] || die "--prefix must be an absolute path"
[[ -z $DESTDIR || $DESTDIR == /* ]] || die "DESTDIR must be absolute, got '$DESTDIR'"
if is_live && [[ $EUID != 0 ]]; then
    die "run as root (or use --dry-run, or DESTDIR=...)"
fi
HELPER=(python3 "$SCRIPT_DIR/daemon_json.py")
DJ=$DESTDIR$DAEMON_JSON

# ------------------------------------------------------------------------------------
say "checks"
set +e
"${HELPER[@]}" remove "$DJ" --check >/dev/null
rc=$?
set -e
((rc <= 1)) || die "$DJ cannot be edited safely (see above); nothing was changed"
d_authz=""
if [[ -z $DESTDIR ]] && command -v docker >/dev/null &&
    info=$(timeout 20 docker info --format '{{.ContainersRunning}}|{{.LiveRestoreEnabled}}|{{json .Plugins.Authorization}}' 2>/dev/null); then
    IFS='|' read -r d_running d_live_restore d_authz <<<"$info"
    note "docker: running; authorization plugins in use: $d_authz"
    if can_start && [[ $d_authz == *'"gpu-alloc"'* && $RELOAD == 0 && $FORCE == 0 ]] &&
        ((d_running > 0)) && [[ $d_live_restore != true ]]; then
        die "$d_running containers are running and live-restore is off: restarting docker" \
            "would stop them. Use --reload, --no-restart or --force."
    fi
else
    note "docker: not reachable${DESTDIR:+ (DESTDIR)}"
fi

say "docker: authorization-plugins in $DAEMON_JSON (first)"
daemon_json remove "$DJ"
if [[ -n $DESTDIR || $DRY_RUN == 1 || $d_authz == *'"gpu-alloc"'* ]]; then
    apply_to_docker
else
    note "the running dockerd does not use gpu-alloc: not restarted"
fi

say "systemd units"
live systemctl disable "${UNITS[@]}"
if is_live && [[ $NO_RESTART == 1 ]]; then
    live systemctl stop gpu-alloc-shim.service
    note "--no-restart: gpu-alloc-plugin.service keeps running and its unit stays until"
    note "docker is restarted; then run this script again to finish."
    exit 0
fi
live systemctl stop "${UNITS[@]}"
for unit in "${UNITS[@]}"; do
    if [[ -e $DESTDIR$UNIT_DIR/$unit ]]; then
        act rm -f "$DESTDIR$UNIT_DIR/$unit"
    fi
done
live systemctl daemon-reload
if [[ -e $DESTDIR$PLUGIN_SOCK ]]; then
    act rm -f "$DESTDIR$PLUGIN_SOCK"
fi

say "files"
if [[ $(readlink "$DESTDIR/usr/local/bin/gpu-alloc" 2>/dev/null) == */bin/gpu-alloc ]]; then
    act rm -f "$DESTDIR/usr/local/bin/gpu-alloc"
fi
if [[ $KEEP_VENV == 0 && -e $DESTDIR$PREFIX/venv ]]; then
    act rm -rf "$DESTDIR$PREFIX/venv"
    if [[ $DRY_RUN == 0 ]]; then rmdir "$DESTDIR$PREFIX" 2>/dev/null || true; fi
fi
if [[ $PURGE == 1 ]]; then
    for dir in "$STATE_DIR" "$CONFIG_DIR"; do
        if [[ -e $DESTDIR$dir ]]; then act rm -rf "$DESTDIR$dir"; fi
    done
else
    note "kept $STATE_DIR (leases) and $CONFIG_DIR; --purge removes them"
fi
say "done"
