#!/usr/bin/env bash
# Install gpu-alloc on a Docker GPU host: venv, config, systemd units, daemon.json.
#
# Usage: sudo deploy/install.sh [options]
#   --prefix DIR        install root (default /opt/gpu-alloc; the venv is DIR/venv)
#   --source DIR        the gpu-alloc checkout to install (default: the one this script is in)
#   --python PY         interpreter for the venv, 3.11 or newer, not under /root or /home
#                       (the units' ProtectHome= hides those); default /usr/bin/python3
#                       when it is 3.11+, else the newest /usr/bin/python3.X
#   --skip-venv         do not create or update the venv (it must already exist to start)
#   --venv-from DIR     use the existing venv DIR instead of PREFIX/venv
#   --wheels DIR        build the venv offline from the wheels in DIR (pip --no-index
#                       --find-links DIR): gpu-alloc's own and its dependencies', made
#                       where PyPI is reachable with `pip wheel -w DIR /path/to/gpu-alloc`
#   --daemon-json FILE  dockerd's config file (default /etc/docker/daemon.json)
#   --no-restart        write and enable everything, but start and restart nothing
#   --reload            apply daemon.json with `systemctl reload docker` (SIGHUP: dockerd
#                       reloads authorization-plugins and running containers keep running)
#                       instead of restarting docker
#   --force             install even though docker's default runtime is nvidia, or
#                       restart docker even though containers are running without live-restore
#   --dry-run           print every action, change nothing
#   DESTDIR=DIR (env)   stage every file under DIR (for tests and packaging); no systemctl,
#                       no docker. A venv built under DESTDIR is not relocatable.
#
# Order on a live host: the plugin is started and must answer POST /Plugin.Activate
# before daemon.json names it and docker is restarted (dockerd exits at start-up when
# a named authorization plugin does not answer); the shim starts last.
# Running it again changes nothing that is already in place.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SOURCE=$(dirname "$SCRIPT_DIR")
PREFIX=/opt/gpu-alloc
PYTHON=""
VENV_MODE=create
VENV=""
WHEELS=""
DAEMON_JSON=/etc/docker/daemon.json
DRY_RUN=0
NO_RESTART=0
RELOAD=0
FORCE=0
DESTDIR=${DESTDIR:-}

CONFIG=/etc/gpu-alloc/config.yaml
STATE_DIR=/var/lib/gpu-alloc
SHIM_RUN_DIR=/run/gpu-alloc
PLUGIN_RUN_DIR=/run/docker/plugins
PLUGIN_SOCK=$PLUGIN_RUN_DIR/gpu-alloc.sock
UNIT_DIR=/etc/systemd/system
UNITS=(gpu-alloc-plugin.service gpu-alloc-shim.service)
ACTIVATE_TIMEOUT=${GPU_ALLOC_ACTIVATE_TIMEOUT:-30}

SCRIPT_NAME=install.sh
# shellcheck source=deploy/lib.sh
source "$SCRIPT_DIR/lib.sh"

while (($#)); do
    case $1 in
    --prefix) PREFIX=${2:?--prefix needs a directory}; shift ;;
    --source) SOURCE=${2:?--source needs a directory}; shift ;;
    --python) PYTHON=${2:?--python needs an interpreter}; shift ;;
    --skip-venv) VENV_MODE=skip ;;
    --venv-from) VENV_MODE=from; VENV=${2:?--venv-from needs a directory}; shift ;;
    --wheels) WHEELS=${2:?--wheels needs a directory}; shift ;;
    --daemon-json) DAEMON_JSON=${2:?--daemon-json needs a file}; shift ;;
    --no-restart) NO_RESTART=1 ;;
    --reload) RELOAD=1 ;;
    --force) FORCE=1 ;;
    --dry-run) DRY_RUN=1 ;;
    -h | --help) usage 0 ;;
    *) printf 'install.sh: unknown option %s\n' "$1" >&2; usage 2 >&2 ;;
    esac
    shift
done

[[ -n $VENV ]] || VENV=$PREFIX/venv
# Paths end up unquoted in ExecStart= lines: keep them plain.
for path in "$PREFIX" "$VENV"; do
    [[ $path =~ ^/[A-Za-z0-9._/+-]*$ ]] || die "'$path' must be an absolute path of plain characters"
done
[[ -z $DESTDIR || $DESTDIR == /* ]] || die "DESTDIR must be absolute, got '$DESTDIR'"

# The units run with ProtectHome=yes: nothing they run may live under /root or /home.
under_home() { [[ $1 =~ ^/(root|home)(/|$) ]]; }
is_311() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }
system_python() {
    local py
    for py in /usr/bin/python3 /usr/{,local/}bin/python3.{14,13,12,11}; do
        [[ -x $py ]] && is_311 "$py" && { echo "$py"; return 0; }
    done
    return 1
}
# die unless the interpreter PY (named by WHAT) and the installation it runs from lie
# outside /root and /home.
check_python() {
    local py=$1 what=$2 dirs dir
    dirs=$("$py" -c 'import os, sys
print(os.path.realpath(sys.executable)); print(os.path.realpath(sys.base_prefix))') ||
        die "$what $py does not run"
    while read -r dir; do
        if under_home "$dir"; then
            die "$what $py runs from $dir, and the units' ProtectHome=yes hides /root and" \
                "/home from gpu-alloc; use a system interpreter (3.11 or newer), e.g." \
                "--python ${DEFAULT_PYTHON:-/usr/bin/python3}"
        fi
    done <<<"$dirs"
}
DEFAULT_PYTHON=$(system_python) || DEFAULT_PYTHON=""
for path in "$PREFIX" "$VENV"; do
    ! under_home "$path" || die "'$path' is under /root or /home, which ProtectHome=yes hides"
done
case $VENV_MODE in
create)
    PYTHON=${PYTHON:-$DEFAULT_PYTHON}
    [[ -n $PYTHON ]] || die "no system Python 3.11 or newer in /usr/bin or /usr/local/bin:" \
        "install one (apt install python3) and pass it with --python"
    is_311 "$PYTHON" || die "$PYTHON is not Python 3.11 or newer"
    check_python "$PYTHON" --python
    ;;
*)
    if [[ -x $DESTDIR$VENV/bin/python ]]; then
        check_python "$DESTDIR$VENV/bin/python" "the venv's"
    fi
    ;;
esac
if [[ -n $WHEELS ]]; then
    WHEELS=$(cd "$WHEELS" && pwd) || die "--wheels: no such directory"
    compgen -G "$WHEELS/gpu_alloc-*.whl" >/dev/null ||
        die "--wheels: no gpu_alloc-*.whl in $WHEELS (make them with: pip wheel -w $WHEELS $SOURCE)"
fi
SOURCE=$(cd "$SOURCE" && pwd) || die "--source: no such directory"
# The system interpreter runs the helpers: whatever python3 comes first on PATH may not.
SYS_PY=${DEFAULT_PYTHON:-${PYTHON:-python3}}
HELPER=("$SYS_PY" "$SCRIPT_DIR/daemon_json.py")
DJ=$DESTDIR$DAEMON_JSON

# ------------------------------------------------------------------------------------
say "checks"
[[ -f $SOURCE/pyproject.toml && -f $SOURCE/deploy/config.example.yaml ]] ||
    die "$SOURCE is not a gpu-alloc checkout (no pyproject.toml / deploy/config.example.yaml)"
if is_live && [[ $EUID != 0 ]]; then
    die "run as root (or use --dry-run, or DESTDIR=... to stage)"
fi

# daemon.json must be editable before anything else changes.
set +e
"${HELPER[@]}" add "$DJ" --check >/dev/null
rc=$?
set -e
((rc <= 1)) || die "$DJ cannot be edited safely (see above); nothing was changed"
note "$DJ: readable"

# The nvidia runtime as the default runtime hands every GPU to any container whose
# image sets NVIDIA_VISIBLE_DEVICES (nvidia/cuda images set "all"), past any allocator.
dj_info=$("${HELPER[@]}" inspect "$DJ")
default_runtime=$("$SYS_PY" -c 'import json,sys; print(json.loads(sys.argv[1])["default_runtime"] or "")' "$dj_info")
runtimes=$("$SYS_PY" -c 'import json,sys; print(" ".join(json.loads(sys.argv[1])["runtimes"]))' "$dj_info")
docker_up=0
if [[ -z $DESTDIR ]] && command -v docker >/dev/null &&
    info=$(timeout 20 docker info --format '{{.DefaultRuntime}}|{{json .Runtimes}}|{{.ContainersRunning}}|{{.LiveRestoreEnabled}}|{{json .Plugins.Authorization}}' 2>/dev/null); then
    docker_up=1
    IFS='|' read -r d_default d_runtimes d_running d_live_restore d_authz <<<"$info"
    default_runtime=${d_default:-$default_runtime}
    runtimes=$("$SYS_PY" -c 'import json,sys; print(" ".join(json.loads(sys.argv[1]) or {}))' "$d_runtimes")
    note "docker: running; default runtime ${default_runtime:-runc}; runtimes: $runtimes"
else
    note "docker: not reachable${DESTDIR:+ (DESTDIR staging)}; runtimes read from $DJ only"
fi
if [[ $default_runtime == nvidia* ]]; then
    msg="docker's default runtime is '$default_runtime': every container whose image sets"
    msg+=" NVIDIA_VISIBLE_DEVICES gets GPUs without asking. Fix: remove"
    msg+=" \"default-runtime\": \"$default_runtime\" from $DAEMON_JSON (or dockerd's"
    msg+=" --default-runtime flag) and restart docker; keep the nvidia runtime listed."
    [[ $FORCE == 1 ]] || die "$msg (or rerun with --force)"
    note "WARNING (--force): $msg"
fi
if [[ " $runtimes " != *" nvidia "* ]]; then
    note "note: no 'nvidia' runtime registered; --gpus still works through the NVIDIA"
    note "      Container Toolkit hook. See: nvidia-ctk runtime configure --runtime=docker"
fi

if is_live && command -v systemctl >/dev/null; then
    # The same setting as a dockerd flag and in daemon.json stops dockerd from starting.
    if systemctl show -p ExecStart --value docker.service 2>/dev/null | grep -q -- '--authorization-plugin'; then
        die "docker.service passes --authorization-plugin on its command line; dockerd refuses" \
            "the same setting in daemon.json too. Move it into $DAEMON_JSON first."
    fi
fi
if can_start && [[ $docker_up == 1 && $RELOAD == 0 && $FORCE == 0 ]] &&
    ((${d_running:-0} > 0)) && [[ $d_live_restore != true && $d_authz != *'"gpu-alloc"'* ]]; then
    die "$d_running containers are running and live-restore is off: restarting docker" \
        "would stop them. Use --reload (dockerd applies authorization-plugins on SIGHUP)," \
        "--no-restart (restart docker yourself later) or --force."
fi

# ------------------------------------------------------------------------------------
changed=0
say "venv: $VENV"
case $VENV_MODE in
create)
    if [[ ! -x $DESTDIR$VENV/bin/python ]]; then
        act "$PYTHON" -m venv "$DESTDIR$VENV"
    fi
    pip=("$DESTDIR$VENV/bin/pip" install --quiet --disable-pip-version-check)
    if [[ -z $WHEELS ]]; then
        act "${pip[@]}" "$SOURCE"
    else
        pip+=(--no-index --find-links "$WHEELS")
        act "${pip[@]}" gpu-alloc
        # The same version number may hold other code: put this wheel's in place.
        act "${pip[@]}" --force-reinstall --no-deps gpu-alloc
    fi
    changed=1
    ;;
skip) note "--skip-venv: left as it is" ;;
from) note "--venv-from: using $VENV as it is" ;;
esac

say "config: $CONFIG"
if [[ -e $DESTDIR$CONFIG ]]; then
    note "exists, left unchanged"
else
    act install -d -m 0755 "$(dirname "$DESTDIR$CONFIG")"
    act install -m 0644 "$SOURCE/deploy/config.example.yaml" "$DESTDIR$CONFIG"
fi

say "directories"
if [[ $EUID == 0 ]]; then owner=(-o root -g root); else owner=(); fi
act install -d -m 0700 "${owner[@]}" "$DESTDIR$STATE_DIR"
act install -d -m 0755 "$DESTDIR$SHIM_RUN_DIR"
if [[ ! -d $DESTDIR$PLUGIN_RUN_DIR ]]; then
    # dockerd makes both 0700 itself; the plugin unit (RuntimeDirectory=) recreates them at boot.
    act install -d -m 0700 "$DESTDIR/run/docker" "$DESTDIR$PLUGIN_RUN_DIR"
fi

say "command: /usr/local/bin/gpu-alloc"
if [[ $(readlink "$DESTDIR/usr/local/bin/gpu-alloc" 2>/dev/null) == "$VENV/bin/gpu-alloc" ]]; then
    note "up to date"
else
    act install -d -m 0755 "$DESTDIR/usr/local/bin"
    act ln -sfn "$VENV/bin/gpu-alloc" "$DESTDIR/usr/local/bin/gpu-alloc"
fi

say "systemd units in $UNIT_DIR"
act install -d -m 0755 "$DESTDIR$UNIT_DIR"
for unit in "${UNITS[@]}"; do
    rendered=$(sed -e "s|@VENV@|$VENV|g" -e "s|@CONFIG@|$CONFIG|g" "$SCRIPT_DIR/$unit")
    target=$DESTDIR$UNIT_DIR/$unit
    if [[ -f $target ]] && [[ $(<"$target") == "$rendered" ]]; then
        note "$unit: up to date"
        continue
    fi
    printf '    + write %s\n' "$target"
    if [[ $DRY_RUN == 0 ]]; then
        printf '%s\n' "$rendered" >"$target.tmp"
        chmod 0644 "$target.tmp"
        mv -f "$target.tmp" "$target"
    fi
    changed=1
done
if is_live && [[ ! -x $VENV/bin/gpu-alloc ]]; then
    die "$VENV/bin/gpu-alloc is missing: build the venv (drop --skip-venv) or pass --venv-from"
fi

say "plugin service (socket $PLUGIN_SOCK; dockerd finds plugin 'gpu-alloc' there, no .spec)"
live systemctl daemon-reload
live systemctl enable "${UNITS[@]}"
if [[ $changed == 1 ]]; then
    live_start systemctl restart gpu-alloc-plugin.service
else
    live_start systemctl start gpu-alloc-plugin.service
fi

activate() {
    if command -v curl >/dev/null; then
        curl -fsS --max-time 2 --unix-socket "$PLUGIN_SOCK" -X POST -d '{}' \
            http://localhost/Plugin.Activate 2>/dev/null
    else
        "$SYS_PY" - "$PLUGIN_SOCK" <<'EOF'
import http.client, socket, sys
c = http.client.HTTPConnection("localhost", timeout=2)
c.sock = socket.socket(socket.AF_UNIX); c.sock.settimeout(2); c.sock.connect(sys.argv[1])
c.request("POST", "/Plugin.Activate", body=b"{}"); r = c.getresponse()
sys.stdout.write(r.read().decode()); sys.exit(r.status != 200)
EOF
    fi
}
printf '    wait for POST /Plugin.Activate on %s to answer "authz"\n' "$PLUGIN_SOCK"
if can_start; then
    deadline=$((SECONDS + ACTIVATE_TIMEOUT))
    until answer=$(activate) && [[ $answer == *'"authz"'* ]]; do
        if ((SECONDS >= deadline)); then
            journalctl -u gpu-alloc-plugin.service -n 40 --no-pager >&2 || true
            die "the plugin did not answer within ${ACTIVATE_TIMEOUT}s (log above);" \
                "$DAEMON_JSON was NOT changed and docker was not restarted"
        fi
        sleep 0.5
    done
    note "plugin answered: $answer"
else
    note "skipped ($(why_not_start))"
fi

say "docker: authorization-plugins and builder.entitlements.device in $DAEMON_JSON"
builds_were_closed=$("$SYS_PY" -c 'import json,sys; print(int(json.loads(sys.argv[1])["build_devices_closed"]))' "$("${HELPER[@]}" inspect "$DJ")")
daemon_json add "$DJ"
if [[ $builds_were_closed == 0 ]]; then
    # dockerd reads the builder settings only when it starts: a reload does not apply them.
    note "builds get no devices from dockerd's next restart (gpu-alloc doctor fails the host"
    note "until then on Docker 29+; gpu-alloc's plugin refuses BuildKit's /grpc meanwhile)"
fi
# Apply when the file changed, or the running dockerd does not use the plugin yet.
if [[ ${d_authz:-} != *'"gpu-alloc"'* ]]; then
    apply_to_docker
    if can_start && [[ $RELOAD == 0 ]]; then
        timeout 20 docker info --format '{{json .Plugins.Authorization}}' | grep -q '"gpu-alloc"' ||
            die "docker restarted but does not list gpu-alloc under Plugins.Authorization"
        note "docker uses the plugin (docker info: Plugins.Authorization)"
    fi
else
    note "the running dockerd already uses gpu-alloc: not restarted"
fi

say "shim service"
if [[ $changed == 1 ]]; then
    live_start systemctl restart gpu-alloc-shim.service
else
    live_start systemctl start gpu-alloc-shim.service
fi

say "done"
if ! can_start; then
    cat <<EOF
    To finish on the host (in this order):
      systemctl daemon-reload && systemctl enable ${UNITS[*]}
      systemctl start gpu-alloc-plugin.service
      curl --unix-socket $PLUGIN_SOCK -X POST http://localhost/Plugin.Activate
      systemctl restart docker.service      # or: systemctl reload docker.service
      systemctl start gpu-alloc-shim.service
EOF
fi
cat <<'EOF'
Users (not with sudo: contexts are per user; they need the docker group):
    docker context create gpu-alloc --docker host=unix:///run/gpu-alloc/docker.sock
    docker --context gpu-alloc run --rm --gpus 1 nvidia/cuda:12.4.1-base-ubuntu22.04 nvidia-smi -L
EOF
