"""Execs, attaches and copies into a container, kept to its owner where it is owned
(`allocator.core.access.owned`): settled on the container as it is now, and, where the
shim forwards one, pinned to that container's full id and marked with who asks.

While the policy grants nobody anything (no ``policy.powers``, no
``policy.engine_socket_binds``, ``policy.privileged: refuse``) no container is owned,
and both are answered without a look at the Engine, a file or the peer.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from allocator.core.access import access, owned, privileged
from allocator.core.api import refs
from allocator.core.api.routes import Check, Route, by_id
from allocator.core.judging.verdicts import ACCESS_READS, DoorCheck, Facts
from allocator.host.engine import Engine
from allocator.host.peers import Peer
from allocator.service.gather import Gatherer
from allocator.service.lookups import Lookups


class Doors:
    """``refusal`` of a way into a container; `mark` of one the shim forwards."""

    def __init__(self, engine: Engine | None, gather: Gatherer, lookups: Lookups):
        self.engine = engine
        self.gather = gather
        self.lookups = lookups

    def open_to_all(self) -> bool:
        """The policy grants nobody anything, so no container holds what its owner alone
        was granted (as last read: no look at the file)."""
        rules = self.gather.rules_in_force
        return not (rules.grants_owners or rules.privileged == privileged.LEASE_ALL)

    def pinned(self, route: Route, target: str) -> str:
        """``target`` naming the container its reference names now by that container's
        full id, so no rename or removal before dockerd looks it up moves the call into
        another container (as the shim forwards a start it judged); as sent when no
        container can be owned, or the reference names none (`refusal` judges that).  An
        exec's start names the exec, which dockerd finds by its full id alone: as sent."""
        if self.open_to_all() or self.engine is None or route.check is Check.EXEC_START:
            return target
        found = self.lookups.target_of(route.name)
        return target if found is None else by_id(target, route, found.id)

    def mark(self, method: str, target: str, peer: Peer | None) -> tuple[str, str] | None:
        """The header that tells the plugin who asks ``method`` ``target`` (`owned.mark`);
        None while no container is owned, or without the state directory's key."""
        if self.open_to_all():
            return None
        key = self.lookups.service_signing().key
        if not key:
            return None
        return owned.HEADER, owned.mark(key, method, target, self.lookups.owner_of(peer).user)

    def refusal(self, check: DoorCheck) -> str | None:
        """Why ``check`` is refused on its container as it is now, or None: on each
        container its reference could name (`owned` rule 5), or on the container of the
        exec it starts."""
        if self.open_to_all() or self.engine is None:
            return None
        if check.door == owned.EXEC_START:
            started = self.engine.inspect_exec(check.ref)
            if started is None:
                return None  # dockerd answers that there is no such exec
            ref = str(started.get("ContainerID") or "")
            info = self.engine.inspect(ref) if ref else None
            return None if info is None else self._on(replace(check, ref=ref), info)
        if refs.is_alias(check.ref):
            return owned.aliased(check)
        could = self.gather.could_name(check.ref)
        if not could:
            return owned.unnamed(check)
        for info in could:
            why = self._on(check, info)
            if why is not None:
                return why
        return None

    def _on(self, check: DoorCheck, info: dict[str, Any]) -> str | None:
        """Why ``check`` is refused on the container ``info`` inspects, or None."""
        fields = self.gather.decide(partial(_held, info), ACCESS_READS)
        if not fields:
            return None
        name = str(info.get("Name") or "").lstrip("/")  # the shim forwards by full id
        said = replace(check, ref=name) if name and check.ref == info["Id"] else check
        return owned.refusal(said, fields, self.lookups.recorded_owner_of(str(info["Id"])))


def _held(info: dict[str, Any], facts: Facts) -> tuple[str, ...]:
    anyone = access.of_container(
        info, facts.engine, facts.known_gpus, facts.host, facts.volume_of
    )  # nobody named: what only a grant lets through is there to see
    return owned.held(anyone)
