"""Sharing a GPU: the policy's shared GPUs, a share's ask, and what a share is given.

Rules
-----
1. A GPU is whole or shared at a time.  A share lease names its one GPU and how many
   of that GPU's ``shares`` it holds (`Lease.share_slots` of `Lease.share_of`); any
   other holder of the GPU (a whole lease, a claim, a reservation, a waiter's keep)
   keeps shares off it, and a GPU with shares out is held for every whole request
   (`State.holders` names its first share's lease).
2. ``mode: mps``: one MPS control daemon per shared GPU (allocator/service/mps.py) whose
   default caps are one share's (`Sharing.memory_of`, `Sharing.threads_of`), set by
   the daemon's own device index 0 (it sees only that GPU).  A client's environment
   can only lower an MPS cap, never raise it, so an MPS share is one share: a larger
   ask is refused, naming a pool with fewer shares instead.
3. ``mode: timeslice``: shares are accounting only: no caps, no daemon, no isolation.
4. MPS serves one uid at a time: a client of another uid waits until the running
   server's clients finish.  So a GPU's shares all run as one user (`Lease.share_user`,
   the container's user as the create and its image say), unless the rule says
   ``users: any``.
5. Shares count as fractions of a GPU wherever GPUs are counted (`fraction`).
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from allocator.core.api import labels, numbers
from allocator.core.machine.cpus import parse_size
from allocator.core.machine.inventory import GPU

MPS = "mps"
TIMESLICE = "timeslice"
MODES = (MPS, TIMESLICE)
SHARE = labels.SHARE  # a client's ask: "1/4" of a GPU
MEMORY = labels.SHARE_MEMORY  # a client's ask: the GPU memory a share must have
PIPE, SHM, LOG = "pipe", "shm", "log"  # a shared GPU's directories under the MPS dir
CLIENT_PIPE = "/run/gpu-alloc-mps"  # where a share's container sees its pipe directory
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
MEMORY_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MPS_ENV_PREFIX = "CUDA_MPS_"
ANY_USER = "any"
_SHARE_PART = numbers.whole("a whole number", high=1 << 16)  # either side of a share's fraction
BIND_DETAIL = "bind of the MPS directory of"  # a grant's detail: a share's bind (access_mounts)


@dataclass(frozen=True)
class Sharing:
    """One ``policy.sharing`` entry: how the GPUs it names are shared."""

    gpus: tuple[int, ...]  # GPU indices (a pool's, when ``pool`` is set)
    shares: int
    mode: str = MPS
    memory: int | None = None  # bytes per share; None: the GPU's memory / shares
    threads: int | None = None  # percent per share; None: 100 / shares
    pool: str | None = None
    spread: bool = False  # place shares on the least used GPU instead of packing
    users: str = "one"  # "one": a GPU's shares run as one user (MPS); "any"

    def covers(self, gpu: GPU) -> bool:
        return not gpu.is_slice and not gpu.mig_mode and gpu.index in self.gpus

    def memory_of(self, gpu: GPU) -> int | None:
        """Bytes one share may pin (None in timeslice mode: nothing caps it)."""
        if self.mode != MPS:
            return None
        return self.memory or gpu.memory_mib * 2**20 // self.shares

    def threads_of(self) -> int | None:
        """Percent of the GPU's threads one share may use (None in timeslice mode)."""
        if self.mode != MPS:
            return None
        return self.threads or max(1, 100 // self.shares)

    def said(self, gpu: GPU) -> str:
        """The rule in words, for status and refusals."""
        if self.mode != MPS:
            return f"{self.shares} timeslice shares (no memory or compute caps, no isolation)"
        mem = self.memory_of(gpu) or 0
        return f"{self.shares} MPS shares of {mem // 2**20} MiB and {self.threads_of()}% each"


def rule_for(gpu: GPU, rules: Sequence[Sharing]) -> Sharing | None:
    """The first rule that shares ``gpu``; None: it is leased whole only."""
    return next((r for r in rules if r.covers(gpu)), None)


@dataclass(frozen=True)
class ShareAsk:
    """A create's ask for part of a GPU: a fraction (``1/4``) or a memory size."""

    num: int = 0
    den: int = 0
    memory: int = 0  # bytes
    user: str = "0"  # the container's user, as the uid rule compares them

    def words(self) -> str:
        return f"{self.num}/{self.den} of a GPU" if self.den else f"{self.memory // 2**20} MiB"

    def slots(self, rule: Sharing, gpu: GPU) -> int | str:
        """How many of ``gpu``'s shares this ask takes, or why it cannot be shares of it."""
        if self.den:
            if (self.num * rule.shares) % self.den:
                return f"{self.words()} is not a whole number of its {rule.shares} shares"
            slots = self.num * rule.shares // self.den
        else:
            per = rule.memory_of(gpu) or gpu.memory_mib * 2**20 // rule.shares
            slots = max(1, math.ceil(self.memory / per)) if per else rule.shares + 1
        if slots > rule.shares:
            return f"{self.words()} is more than its {rule.shares} shares"
        if rule.mode == MPS and slots > 1:
            return (
                f"{self.words()} is {slots} of its {rule.shares} MPS shares, and an MPS "
                "share's caps cannot be raised past one share's"
            )
        return slots


def share_ask(given: Mapping[str, object] | None) -> ShareAsk | str | None:
    """The share a create's labels ask for (None: a whole GPU), or why they cannot be read."""
    given = given or {}
    raw, size = given.get(SHARE), given.get(MEMORY)
    if raw in (None, "") and size in (None, ""):
        return None
    if raw not in (None, "") and size not in (None, ""):
        return f"label {SHARE} and label {MEMORY} both ask for a share: give one of them"
    if raw not in (None, ""):
        num, slash, den = str(raw).partition("/")
        # ASCII digits only, through the strict reader: ``²`` passes str.isdigit and then
        # fails int(), and int() reads ``١/٤`` and ``1/４`` as 1/4.
        top, bottom = numbers.maybe(num, _SHARE_PART), numbers.maybe(den, _SHARE_PART)
        if not (slash and top is not None and bottom is not None and 0 < top < bottom):
            return f"label {SHARE}={raw}: expected a fraction of one GPU such as 1/4"
        return ShareAsk(int(top), int(bottom))
    try:
        memory = parse_size(str(size))
    except ValueError as e:
        return f"label {MEMORY}: {e}"
    if memory <= 0:
        return f"label {MEMORY}={size}: ask for more than zero, such as 20GiB"
    return ShareAsk(memory=memory)


def user_of(spec_user: str, image_user: str) -> str:
    """The user a container runs as, as the uid rule compares them: the create's ``User``,
    else the image's, else root; the group part dropped, root spelt 0."""
    user = (spec_user or image_user or "0").partition(":")[0] or "0"
    return "0" if user == "root" else user


def fraction(slots: int, of: int) -> float:
    """A share's part of a GPU, as limits and reports count it."""
    return slots / of if of else 1.0


def gpu_dir(mps_dir: str, uuid: str) -> str:
    return posixpath.join(mps_dir, uuid)


def share_dir_gpu(real: str, mps_dir: str, known: Collection[str]) -> str | None:
    """The GPU whose MPS pipe or shm directory ``real`` is exactly; None for any other
    path (a bind reaching anything else under the MPS dir stays a protected path)."""
    if not mps_dir:
        return None
    parent, leaf = posixpath.split(real)
    top, uuid = posixpath.split(parent)
    if leaf in (PIPE, SHM) and top == posixpath.normpath(mps_dir) and uuid in known:
        return uuid
    return None


def client_env(rule: Sharing, gpu: GPU, slots: int) -> list[str]:
    """The environment a share's container gets: where its MPS pipe is, and its caps
    (an MPS client can lower the daemon's caps, never raise them)."""
    if rule.mode != MPS:
        return []
    mem = (rule.memory_of(gpu) or 0) * slots
    threads = (rule.threads_of() or 100) * slots
    return [
        f"{PIPE_ENV}={CLIENT_PIPE}",
        f"{MEMORY_ENV}=0={mem // 2**20}M",
        f"{THREADS_ENV}={threads}",
    ]


def client_binds(mps_dir: str, uuid: str, mode: str) -> list[str]:
    """The binds a share's container gets: its GPU's pipe directory and its private
    /dev/shm, which the daemon's server shares (none in timeslice mode)."""
    if mode != MPS:
        return []
    top = gpu_dir(mps_dir, uuid)
    return [f"{top}/{PIPE}:{CLIENT_PIPE}", f"{top}/{SHM}:/dev/shm"]


def held_share(
    given: Mapping[str, object], binds: Sequence[str], uuid: str, rule: Sharing | None, mps_dir: str
) -> tuple[int, int] | None:
    """The share (slots, of how many) that a container the shim made for a share lease of
    ``uuid`` holds, read back from it when its lease is gone from the ledger (``gpu-alloc
    repair --reset``); None: no share of a GPU ``rule`` shares now.  The share label alone
    could be an image's (dockerd merges an image's labels into its containers), so an MPS
    share must also have the binds of its GPU's pipe and /dev/shm that the shim gives a
    share."""
    if rule is None or not labels.lease_of(given):
        return None
    slots, slash, of = str(given.get(SHARE) or "").partition("/")
    if not (slash and slots.isdigit() and of.isdigit() and 0 < int(slots) <= int(of)):
        return None
    if not set(client_binds(mps_dir, uuid, rule.mode)) <= set(binds):
        return None
    return int(slots), int(of)


def daemon_commands(rule: Sharing, gpu: GPU) -> list[str]:
    """What the GPU's control daemon is told once it runs: one share's caps by index 0,
    its only device (MPS names devices by index, never by UUID)."""
    mem, threads = rule.memory_of(gpu), rule.threads_of()
    if mem is None or threads is None:
        return []
    return [
        f"set_default_device_pinned_mem_limit 0 {mem // 2**20}M",
        f"set_default_active_thread_percentage {threads}",
    ]


def client_refusal(env: Sequence[str], ipc: str) -> str | None:
    """Why a share's create cannot go as the client wrote it: its own ``CUDA_MPS_*``
    settings (which could point at another GPU's pipe or ask past its caps), or an IPC
    mode that replaces the share's private /dev/shm."""
    own = sorted({str(e).partition("=")[0] for e in env if str(e).startswith(MPS_ENV_PREFIX)})
    if own:
        return (
            f"it sets {', '.join(own)}; gpu-alloc sets a share's MPS pipe and caps itself "
            "(a client may not point elsewhere or raise them): remove them"
        )
    if ipc == "host" or ipc.startswith("container:"):
        return (
            f"--ipc {ipc} would replace the share's private /dev/shm, which its MPS "
            "server uses: leave --ipc out, or use private"
        )
    return None
