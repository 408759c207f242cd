"""Every rank of a group compiles with the same backend configuration, checked at compile time.

The passes decide identically on every rank only if every rank runs them with the same ``OVERLAP_*``
values, knobs and package source (docs/architecture.md#same-decision-on-every-rank). A rank that differs
(``OVERLAP_DISABLE=1`` on one rank, another ``OVERLAP_MIN_NUMEL``, another release of the package) would
otherwise pair its collectives with its peers' point-to-point steps: gloo aborts the process, NCCL hangs or
returns garbage. So each compile whose graph communicates publishes this rank's configuration in the default
process group's store (a disabled rank too: it only writes the key), and a rank that is not disabled waits,
for at most ``OVERLAP_TIMEOUT_S``, until every rank of each group it communicates over has published the same
one; otherwise every such rank raises :class:`RankConfigMismatchError`, naming the ranks and what differs,
before any communication of the backend's own. Store keys, not collectives: a rank whose peers run plain
Inductor must not leave a collective of its own unmatched.
"""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import timedelta

from .config import PATH_FIELDS, ConfigError, OverlapConfig
from .spec.knobs import knobs_hash, runtime as runtime_knobs

KEY_PREFIX = "overlap_backend/rank_config/"

_published: dict[int, str] = {}  # id of the store -> the payload this rank last wrote there


class RankConfigMismatchError(ConfigError):
    """The ranks of a process group compile with different backend configurations, or some of them not
    with ``backend="overlap"`` within ``OVERLAP_TIMEOUT_S``."""


def payload(config: OverlapConfig, source: str) -> str:
    """What the ranks must agree on, as the JSON this rank publishes: every field but the paths (under the
    variable it comes from), the knobs and ``source`` (a digest of the package's source)."""
    if config.disable:
        return json.dumps({"OVERLAP_DISABLE": "1"}, sort_keys=True)
    env = OverlapConfig._ENV
    values = {env[f.name][0]: repr(getattr(config, f.name)) for f in dataclasses.fields(config)
              if f.name not in PATH_FIELDS}
    values["passes named"] = repr(config.passes_named)
    values["knobs (overlap_backend.spec.knobs)"] = knobs_hash()
    values["overlap_backend source"] = source[:16]
    return json.dumps(values, sort_keys=True)


def _store_and_group(group_name: str | None = None):
    """The default group's store and the group ``group_name`` (or the default group), or None where there is
    nothing to agree on: no process group, one rank, a fake group (one process plays every rank)."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_store, _resolve_process_group

    if not dist.is_available() or not dist.is_initialized():
        return None
    group = _resolve_process_group(group_name) if group_name else dist.group.WORLD
    if str(dist.get_backend(group)) == "fake" or dist.get_world_size() == 1:
        return None
    return _get_default_store(), group


def publish(config: OverlapConfig, source: str) -> str:
    """Write this rank's configuration to the store (only when it changed since its last write); returns it."""
    import torch.distributed as dist

    mine = payload(config, source)
    found = _store_and_group()
    if found is not None and _published.get(id(found[0])) != mine:
        found[0].set(f"{KEY_PREFIX}{dist.get_rank()}", mine)
        _published[id(found[0])] = mine
    return mine


def agree(config: OverlapConfig, group_names: list[str], source: str) -> None:
    """Publish this rank's configuration and wait until every rank of each of ``group_names`` has published
    the same (at most ``config.timeout_s``); raise :class:`RankConfigMismatchError` otherwise."""
    import torch.distributed as dist

    mine = publish(config, source)
    for name in group_names:
        found = _store_and_group(name)
        if found is None:
            continue
        store, group = found
        # read at every compile (a key read per peer): a peer's configuration may change between compiles
        peers = [r for r in dist.get_process_group_ranks(group) if r != dist.get_rank()]
        theirs = _wait_for_peers(store, peers, mine, config.timeout_s)
        differ = {r: v for r, v in theirs.items() if v != mine}
        if differ:
            raise RankConfigMismatchError(_describe(name, mine, differ, config.timeout_s))


def _wait_for_peers(store, peers: list[int], mine: str, timeout_s: float) -> dict[int, str | None]:
    """Each peer's published configuration (None: none yet) once all equal ``mine``, or at the deadline."""
    deadline = time.monotonic() + timeout_s
    theirs: dict[int, str | None] = {r: None for r in peers}
    pending = list(peers)
    while True:
        for r in list(pending):
            k = f"{KEY_PREFIX}{r}"
            if store.check([k]):
                theirs[r] = store.get(k).decode()
                if theirs[r] == mine:
                    pending.remove(r)
        left = deadline - time.monotonic()
        if not pending or left <= 0:
            return theirs
        absent = [f"{KEY_PREFIX}{r}" for r in pending if theirs[r] is None]
        if absent and len(absent) == len(pending):  # nobody published yet: block in the store, not a poll
            try:
                store.wait(absent, timedelta(seconds=min(left, 1.0)))
            except Exception:  # noqa: BLE001 - the store's timeout: look again
                pass
        else:
            time.sleep(min(runtime_knobs.RANK_CONFIG_POLL_S, left))


def _describe(group_name: str, mine: str, differ: dict[int, str | None], timeout_s: float) -> str:
    import torch.distributed as dist

    own = json.loads(mine)
    lines = []
    for r, value in sorted(differ.items()):
        if value is None:
            lines.append(f"rank {r}: no compile with backend='overlap' within OVERLAP_TIMEOUT_S={timeout_s:g} s (it "
                         "compiles plain, or later than this rank by more than that: raise OVERLAP_TIMEOUT_S then)")
            continue
        other = json.loads(value)
        if other.get("OVERLAP_DISABLE") == "1" and len(other) == 1:
            lines.append(f"rank {r}: OVERLAP_DISABLE=1 (not on this rank)")
            continue
        fields = sorted(set(own) | set(other))
        diffs = [f"{f} = {other.get(f)} (this rank: {own.get(f)})" for f in fields if own.get(f) != other.get(f)]
        lines.append(f"rank {r}: " + "; ".join(diffs))
    return (f"overlap_backend: the ranks of process group {group_name!r} compile with different configurations, "
            f"so their rewrites would not match (this is rank {dist.get_rank()}). Every rank must be given the same "
            "OVERLAP_* values and the same overlap_backend:\n  " + "\n  ".join(lines))


def forget() -> None:
    """Process groups were destroyed: a new store may reuse an old one's id."""
    _published.clear()


def _install() -> None:
    from .runtime.symm import registry

    if forget not in registry.on_destroy:
        registry.on_destroy.append(forget)


_install()
