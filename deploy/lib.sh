# shellcheck shell=bash
# Shared by install.sh and uninstall.sh (sourced, not run): output, dry-run and
# DESTDIR handling, and the daemon.json edit both scripts make.
# The caller sets SCRIPT_NAME, DRY_RUN, DESTDIR, NO_RESTART, RELOAD and HELPER.

say() { printf '==> %s\n' "$*"; }
note() { printf '    %s\n' "$*"; }
die() {
    printf '%s: error: %s\n' "$SCRIPT_NAME" "$*" >&2
    exit 1
}
usage() {
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
    exit "${1:-0}"
}

is_live() { [[ -z $DESTDIR && $DRY_RUN == 0 ]]; }
can_start() { is_live && [[ $NO_RESTART == 0 ]]; }
why_not_live() { if [[ $DRY_RUN == 1 ]]; then echo "dry run"; else echo "DESTDIR"; fi; }
why_not_start() { if is_live; then echo "--no-restart"; else why_not_live; fi; }

# Run a command that changes the host (or DESTDIR): printed always, run unless --dry-run.
act() {
    printf '    + %s\n' "$*"
    [[ $DRY_RUN == 1 ]] || "$@"
}

# Run a service-manager command: only on a live host (no DESTDIR, no --dry-run).
live() {
    if ! is_live; then
        printf '    skipped (%s): %s\n' "$(why_not_live)" "$*"
        return 0
    fi
    printf '    + %s\n' "$*"
    "$@"
}

# Start/restart commands: additionally skipped under --no-restart.
live_start() {
    if is_live && [[ $NO_RESTART == 1 ]]; then
        printf '    skipped (--no-restart): %s\n' "$*"
        return 0
    fi
    live "$@"
}

# daemon_json add|remove FILE: edit "authorization-plugins" (a dry run only checks).
daemon_json() {
    local flags=() rc
    [[ $DRY_RUN == 0 ]] || flags=(--check)
    set +e
    "${HELPER[@]}" "$1" "$2" "${flags[@]}" | sed 's/^/    /'
    rc=${PIPESTATUS[0]}
    set -e
    ((rc <= 1)) || die "could not update $2"
}

# Make dockerd read daemon.json again: SIGHUP with --reload, else a restart.
apply_to_docker() {
    if [[ $RELOAD == 1 ]]; then
        live_start systemctl reload docker.service
    else
        live_start systemctl restart docker.service
    fi
}
