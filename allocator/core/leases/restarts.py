"""Restart policies: the starts dockerd makes without a request.

dockerd starts a container whose restart policy says so when the daemon starts
and after the container exits, and none of those starts passes the plugin.  A
restart policy is therefore a standing start, and follows the start rule
(`allocator.core.judging.starts`):

1. A container may carry a restart policy only while a start of it would be
   allowed: it reaches no GPU, or only GPUs of its own live lease.  An update that
   sets a policy on any other container is refused.
2. Whenever gpu-alloc stops vouching for a container's GPUs while the container
   exists (its lease expires, it lends its GPUs to a Compose replacement), the
   container's policy is turned off first: a crash in between leaves a policy off
   on a container that still holds its lease, which dockerd can act on safely.
3. At shim start every container a start of which would be refused has its policy
   turned off, whatever left it on.

dockerd's ``Name`` values are ``""`` (an update: leave the policy as it is; a create:
none), ``no``, ``always``, ``unless-stopped`` and ``on-failure`` (with
``MaximumRetryCount``, the CLI's ``on-failure:N``); it refuses every other
spelling.  Anything but ``""`` and ``no`` counts as a policy here, so a spelling
dockerd might read differently is refused rather than trusted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

NONE = ("", "no")
OFF = {"RestartPolicy": {"Name": "no"}}  # the update body that turns a policy off


def described(policy: Mapping[str, Any] | None) -> str:
    """``always``, ``on-failure:3``: a policy as the CLI writes it; ``""`` for none."""
    name = str((policy or {}).get("Name") or "")
    if name in NONE:
        return ""
    retries = (policy or {}).get("MaximumRetryCount")
    return f"{name}:{retries}" if name == "on-failure" and retries else name


def standing(info: Mapping[str, Any]) -> str:
    """The restart policy a container's inspect holds (`described`), ``""`` for none."""
    return described((info.get("HostConfig") or {}).get("RestartPolicy"))


def asked(spec: Mapping[str, Any] | None) -> str:
    """The restart policy an update body sets (`described`), ``""`` when it sets none."""
    return described((spec or {}).get("RestartPolicy"))


def update_refusal(ref: str, policy: str, start_refusal: str) -> str:
    """Why ``--restart policy`` on ``ref`` is refused: dockerd would make the start that
    ``start_refusal`` refuses, without asking."""
    return (
        f"gpu-alloc refused the container update: restart policy {policy} would have "
        f"dockerd start {ref} by itself (when the daemon starts, with no request gpu-alloc "
        f"sees), and a start of it is refused ({start_refusal}). Remove it (docker rm) and "
        f"run it again through gpu-alloc with the policy (docker --context gpu-alloc run "
        f"--restart {policy} --gpus ...)"
    )
