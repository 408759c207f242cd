"""Every rank of a group compiles with the same backend configuration, checked at compile time.

The passes decide identically on every rank only if every rank runs them with the same ``OVERLAP_*``
values, knobs and package source (docs/architecture.md#same-decision-on-every-rank). A rank that differs
(``OVERLAP_DISABLE=1`` on one rank, another ``OVERLAP_MIN_NUMEL``, another release of the package) would
otherwise pair its collectives with its peers' point-to-point steps: gloo aborts the process, NCCL hangs or
returns garbage.

So each compile records, in the default process group's store, the rank's latest configuration (a disabled
rank records that it is disabled), and each compile whose graph communicates over a group counts this rank in
for (group, configuration), once: the rank that completes the count marks it done. A rank that is not
disabled waits for that mark, for at most ``max(OVERLAP_TIMEOUT_S, knobs.runtime.RANK_CONFIG_MIN_WAIT_S)``
(compile times differ between ranks more than the run-time waits), and otherwise raises
:class:`RankConfigMismatchError` naming each rank that did not come and what its latest compile had, before any
communication of the backend's own. A mark per configuration, not one latest value: a program may compile
with several configurations, and a rank may recompile a graph that its peers do not; a counter, so a group of
N ranks costs O(N) store operations, not N waits on N keys. Store keys, not a collective: a rank whose peers
run plain Inductor must not be left with a collective of its own that they never match.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

from .config import ConfigError, OverlapConfig
from .spec.knobs import knobs_hash, runtime as runtime_knobs

KEY_PREFIX = "overlap_backend/rank_config/"
_DISABLED = {"OVERLAP_DISABLE": "1"}  # a disabled rank's configuration

# (id of the store, rank; ranks may be threads of one process) -> the configuration it last recorded there
_latest_recorded: dict[tuple[int, int], str] = {}
_counted: set[tuple[int, int, str]] = set()  # (id of the store, rank, group and configuration) counted in


class RankConfigMismatchError(ConfigError):
    """The ranks of a process group compile with different backend configurations, or some of them not
    with ``backend="overlap"`` within the wait."""


def payload(config: OverlapConfig, source: str) -> str:
    """What the ranks must agree on, as JSON: every field but the paths (under the variable it comes from),
    the knobs and ``source`` (a digest of the package's source); a disabled rank's says only that."""
    if config.disable:
        return json.dumps(_DISABLED)
    values = {OverlapConfig._ENV[name][0]: repr(value) for name, value in config.rewrite_fields().items()}
    values["passes named"] = repr(config.passes_named)
    values["knobs (overlap_backend.spec.knobs)"] = knobs_hash()
    values["overlap_backend source"] = source[:16]
    return json.dumps(values, sort_keys=True)


def _latest_key(rank: int) -> str:
    return f"{KEY_PREFIX}{rank}/latest"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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
    """Record in the store that this rank's latest compile has this configuration; returns its payload."""
    import torch.distributed as dist

    mine = payload(config, source)
    found = _store_and_group()
    if found is None:
        return mine
    store, rank = found[0], dist.get_rank()
    at = (id(store), rank)
    if _latest_recorded.get(at) != mine:
        store.set(_latest_key(rank), mine)
        _latest_recorded[at] = mine
    return mine


def agree(config: OverlapConfig, group_names: list[str], source: str) -> None:
    """Record this rank's configuration, count it in for each of ``group_names``, and wait until every rank of
    each has come with the same configuration; raise :class:`RankConfigMismatchError` at the end of the wait
    otherwise."""
    import torch.distributed as dist

    mine = publish(config, source)
    wait_s = max(config.timeout_s, runtime_knobs.RANK_CONFIG_MIN_WAIT_S)
    rank = dist.get_rank()
    for name in group_names:
        found = _store_and_group(name)
        if found is None:
            continue
        store, group = found
        ranks = sorted(dist.get_process_group_ranks(group))
        where = f"{KEY_PREFIX}groups/{_digest(','.join(map(str, ranks)))}/{_digest(mine)}/"
        if len(ranks) < 2 or store.check([where + "done"]):  # agreed at an earlier compile: one store read
            continue
        if (id(store), rank, where) not in _counted:
            _counted.add((id(store), rank, where))
            store.set(f"{where}rank{rank}", "1")  # (who came: for the error)
            if store.add(where + "arrived", 1) == len(ranks):
                store.set(where + "done", "1")
        try:
            store.wait([where + "done"], timedelta(seconds=wait_s))
        except Exception:  # noqa: BLE001 - the store's timeout (its type differs between stores)
            missing = {r: _latest(store, r) for r in ranks if r != rank and not store.check([f"{where}rank{r}"])}
            raise RankConfigMismatchError(_describe(name, mine, missing, wait_s)) from None


def _latest(store, rank: int) -> str | None:
    key = _latest_key(rank)
    return store.get(key).decode() if store.check([key]) else None


def _describe(group_name: str, mine: str, missing: dict[int, str | None], wait_s: float) -> str:
    import torch.distributed as dist

    own = json.loads(mine)
    lines = []
    for r, value in sorted(missing.items()):
        other = json.loads(value) if value is not None else None
        if other is None:
            lines.append(f"rank {r}: no compile with backend='overlap' within {wait_s:g} s (it compiles plain, or "
                         "later than this rank by more than that: raise OVERLAP_TIMEOUT_S then)")
        elif other == _DISABLED:
            lines.append(f"rank {r}: OVERLAP_DISABLE=1 (not on this rank)")
        elif other == own:
            lines.append(f"rank {r}: the same configuration, but no graph that communicates over this group within "
                         f"{wait_s:g} s (the ranks trace different graphs, or it is later by more than that)")
        else:
            fields = sorted(set(own) | set(other))
            diffs = [f"{f} = {other.get(f)} (this rank: {own.get(f)})" for f in fields if own.get(f) != other.get(f)]
            lines.append(f"rank {r}, its latest compile: " + "; ".join(diffs))
    return (f"overlap_backend: the ranks of process group {group_name!r} compile with different configurations, "
            f"so their rewrites would not match (this is rank {dist.get_rank()}). Every rank must be given the same "
            "OVERLAP_* values, knobs and overlap_backend:\n  " + "\n  ".join(lines))


def forget() -> None:
    """Process groups were destroyed: a new store may reuse an old one's id."""
    _latest_recorded.clear()
    _counted.clear()


def _install() -> None:
    from .runtime.symm import registry

    if forget not in registry.on_destroy:
        registry.on_destroy.append(forget)


_install()
