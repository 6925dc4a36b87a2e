"""Managed-plugin calls that would change the authorization chain dockerd consults.

dockerd finds an authorization plugin by name among its *managed* plugins before any
spec file (moby ``plugin/store.go`` ``Get``: a v2 plugin of that name wins, a disabled
one is an error), at every start and reload.  So a managed plugin put under the name of
a configured authorization plugin answers instead of it from the next reload on, and
disabling, removing, upgrading or reconfiguring the managed plugin a configured name
finds turns gpu-alloc off.  The authorization chain is the operator's (daemon.json),
never a user's: such calls are refused here, and so is enabling any plugin that
implements ``authz``.

Names and references are read as dockerd reads them: a name is normalised
(``gpu-alloc`` == ``docker.io/library/gpu-alloc:latest``, kept as ``gpu-alloc:latest``),
and a reference is a full id, else a name, else a unique id prefix
(``resolvePluginID``).  A reference is judged by every plugin it could name (by name
or by id prefix), not only the one it names now, so no removal between the verdict and
the Engine's act can point it elsewhere.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from allocator.core.access import powers
from allocator.core.api.routes import Check, Route

AUTHZ_TYPE = "docker.authz/1.0"
AUTHZ_CAPABILITY = "authz"  # what dockerd's plugin store matches, whatever prefix or version
_FULL_ID = re.compile(r"[a-f0-9]{64}\Z")
OPERATOR = (
    "the authorization plugins dockerd consults are the operator's to change: edit "
    '"authorization-plugins" in daemon.json (or the host\'s gpu-alloc install) and '
    "restart docker"
)


@dataclass(frozen=True)
class PluginCheck:
    """Allow ``action`` on plugin reference ``ref`` only if `refusal` finds nothing
    against dockerd's managed plugins (``GET /plugins``).  ``chain``: the authorization
    plugin names dockerd is configured with."""

    ref: str
    action: str  # enable, disable, remove, upgrade, set
    chain: tuple[str, ...]


def verdict(
    route: Route,
    method: str,
    uri: str,
    body: Any,
    chain: tuple[str, ...],
    exposes: Callable[[str], str],
) -> str | PluginCheck | None:
    """A refusal's text, a `PluginCheck` for the caller to settle, or None (allowed).

    ``body``: the request's, decoded (privileges for a pull or upgrade, settings for a
    set); ``chain``: the configured authorization plugins; ``exposes(path)``: what a bind
    of ``path`` would expose, in words (empty: nothing)."""
    if route.check in (Check.PLUGIN_INSTALL, Check.PLUGIN_UPGRADE):
        held = outside_allow_list(body)
        if held:
            return (
                f"gpu-alloc refused the plugin install: by its privileges it asks for "
                f"{held}; a plugin serves every user, so {powers.KEY} grants it nothing: "
                "install plugins that do without them"
            )
        for p in body or ():
            name = str((p or {}).get("Name") or "")
            values = [str(v) for v in (p or {}).get("Value") or ()]
            if name in ("device", "devices", "allow-all-devices"):
                return (
                    f"gpu-alloc refused the plugin install: it asks for the privilege "
                    f"'{name}' {values}, which can reach GPUs outside any lease"
                )
            exposed = [mount_exposure(v, exposes) for v in values] if name == "mount" else []
            exposed = [e for e in exposed if e]
            if exposed:
                return (
                    f"gpu-alloc refused the plugin install: it asks for the privilege "
                    f"'{name}' {values}: {exposed[0]}; a plugin may mount paths that expose "
                    "no GPU device, Engine or gpu-alloc file"
                )
        if route.check is Check.PLUGIN_INSTALL:
            return pull_refusal(uri, chain)
        return PluginCheck(route.name, "upgrade", chain)
    if route.check is Check.PLUGIN_SET:
        for s in body or ():
            key, _, value = str(s).partition("=")
            source = key.partition(".")[2].lower() == "source"  # dockerd's "<mount>.source"
            reaches = mount_exposure(value, exposes) if source else exposes(value)
            if "device" in key.lower() or reaches:
                return (
                    f"gpu-alloc refused the plugin setting '{s}': it can give the plugin "
                    f"device access outside any lease{f' ({reaches})' if reaches else ''}"
                )
        return PluginCheck(route.name, "set", chain)
    action = "remove" if method == "DELETE" else route.path.rsplit("/", 1)[-1]
    return PluginCheck(route.name, action, chain)


def outside_allow_list(privileges: Any) -> str:
    """A power over the host a plugin's privileges (``host pid namespace``,
    ``capabilities``) hold outside the allow-list (`powers`), in words; empty: none.  A
    plugin serves every user, so no owner's grant covers it."""
    named = {
        str((p or {}).get("Name") or ""): (p or {}).get("Value") or () for p in privileges or ()
    }
    config = {
        "PidMode": "host" if "host pid namespace" in named else "",
        "CapAdd": [str(c) for c in named.get("capabilities") or ()],
    }
    found = powers.refused(config)
    return f"{found[0].value}, which {found[0].why}" if found else ""


def mount_exposure(source: str, exposes: Callable[[str], str]) -> str:
    """What a managed plugin's mount of ``source`` exposes, in words (empty: nothing).

    dockerd hands the source to runc as the manifest or ``plugin set`` spells it, and runc
    joins a relative one to its working directory, the plugin's bundle, cleaning it as
    Go's ``filepath.Join`` does: ``..`` climbs out of the bundle and stops at ``/``, so
    enough of them reach any path of the host, at a depth (the bundle's) gpu-alloc cannot
    see before the plugin exists.  Such a source is refused; one that stays inside the
    bundle reaches the plugin's own files.  An absolute source is judged like any bind."""
    if source.startswith("/"):
        return exposes(source)
    cleaned = posixpath.normpath(source) if source else "."
    if cleaned == ".." or cleaned.startswith("../"):
        return (
            f"the relative mount source {source} climbs out of the plugin's bundle "
            "directory, where runc resolves it, and so can reach any path of the host; "
            "give it an absolute source"
        )
    return ""


def familiar(ref: str) -> str:
    """The name dockerd's plugin store keeps for ``ref`` (distribution/reference's
    ParseNormalizedNamed, TagNameOnly, FamiliarString), digest dropped.  Lower-cased:
    dockerd refuses upper case in a name, and comparing without case fails closed."""
    name = ref.partition("@")[0].lower()
    tag = "latest"
    colon = name.rfind(":")
    if colon > name.rfind("/"):
        name, tag = name[:colon], name[colon + 1 :] or "latest"
    domain, slash, rest = name.partition("/")
    if not slash or not ("." in domain or ":" in domain or domain == "localhost"):
        domain, rest = "docker.io", name
    if domain in ("docker.io", "index.docker.io"):
        name = rest.removeprefix("library/") if rest.count("/") == 1 else rest
    return f"{name}:{tag}"


def pull_name(uri: str) -> str:
    """The name ``POST /plugins/pull`` installs under: ``name=``, else ``remote=`` (the
    router's ``getName``); Go's FormValue takes the first of each."""
    query = parse_qs(uri.partition("?")[2], keep_blank_values=True)
    return (query.get("name") or [""])[0] or (query.get("remote") or [""])[0]


def pull_refusal(uri: str, chain: Iterable[str]) -> str | None:
    """A pull whose name would shadow a configured authorization plugin."""
    name = pull_name(uri)
    taken = next((c for c in chain if familiar(c) == familiar(name)), None) if name else None
    if taken is None:
        return None
    return (
        f"gpu-alloc refused the plugin install as '{name}': dockerd looks its authorization "
        f"plugin '{taken}' up among managed plugins first, so a plugin under that name "
        f"would answer instead of gpu-alloc from dockerd's next reload on; install it "
        f"under another name ('docker plugin install --alias OTHER ...'); {OPERATOR}"
    )


def resolves(ref: str, plugins: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The plugin dockerd resolves ``ref`` to now (``resolvePluginID``), if any."""
    if _FULL_ID.match(ref):
        return [p for p in plugins if p.get("Id") == ref]
    named = [p for p in plugins if familiar(str(p.get("Name") or "")) == familiar(ref)]
    if named:
        return named
    prefixed = [p for p in plugins if str(p.get("Id") or "").startswith(ref)]
    return prefixed if len(prefixed) == 1 else []


def reachable(ref: str, plugins: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Every plugin ``ref`` names now or could name once others are gone: by name or by
    id prefix."""
    name = familiar(ref)
    return [
        p
        for p in plugins
        if familiar(str(p.get("Name") or "")) == name
        or (ref and str(p.get("Id") or "").startswith(ref))
    ]


def is_authz(plugin: Mapping[str, Any]) -> bool:
    """The plugin implements authorization as dockerd finds one: by the capability of any
    of its interface types (``docker.authz/2.0``, ``docker.authz``), not the exact text."""
    types = ((plugin.get("Config") or {}).get("Interface") or {}).get("Types") or ()
    return any(capability(str(t)) == AUTHZ_CAPABILITY for t in types)


def capability(kind: str) -> str:
    """An interface type's capability, split as moby's ``PluginInterfaceType`` unmarshals
    it: the prefix ends at the last ``.`` before the first ``/``, the version follows that
    ``/``.  Compared without case: a near-spelling fails closed."""
    head = kind.partition("/")[0]
    return head.rpartition(".")[2].lower()


def refusal(check: PluginCheck, plugins: Sequence[Mapping[str, Any]]) -> str | None:
    """Why ``check`` must be refused, against the managed plugins ``plugins`` lists."""
    hit = reachable(check.ref, plugins)
    if check.action == "enable":
        authz = next((p for p in hit if is_authz(p)), None)
        if authz is None:
            return None
        return (
            f"gpu-alloc refused enabling plugin '{check.ref}': {_named(authz)} implements "
            f"{_types(authz)} (dockerd's {AUTHZ_CAPABILITY} capability), and an enabled "
            f"authorization plugin can take the place of the one dockerd consults; {OPERATOR}"
        )
    chain = {str(p.get("Id")): name for name in check.chain for p in resolves(name, plugins)}
    own = next((p for p in hit if str(p.get("Id")) in chain), None)
    if own is None:
        return None
    return (
        f"gpu-alloc refused to {check.action} plugin '{check.ref}': {_named(own)} is the "
        f"authorization plugin '{chain[str(own.get('Id'))]}' dockerd consults, and without "
        f"it nothing guards the GPUs; {OPERATOR}"
    )


def _types(plugin: Mapping[str, Any]) -> str:
    types = ((plugin.get("Config") or {}).get("Interface") or {}).get("Types") or ()
    return ", ".join(str(t) for t in types)


def _named(plugin: Mapping[str, Any]) -> str:
    return f"{plugin.get('Name')} (id {str(plugin.get('Id') or '')[:12]})"
