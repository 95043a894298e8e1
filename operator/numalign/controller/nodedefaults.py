"""Node defaults: push the policy selected by ``nodeSelector`` into NodeTopology.spec.

For each NodeTopology (one per node, named after it), the valid TopologyPolicies whose
``nodeSelector`` matches the Node's labels are ranked (priority, then nodeSelector size,
then name, :func:`.resolution.node_default_for`); the winner's policy, scope and options
become ``spec`` with ``source: TopologyPolicy/<name>``, and ``policyGeneration`` is
bumped on every change (the agent echoes it in ``status.observedPolicyGeneration``).
No matching policy clears the default. On a kubelet-managed real node
(:meth:`numalign.api.effective.NodeKind.of`, from the NodeTopology and the Node's labels)
the kubelet admits the pods under its own policy: that policy and scope are the spec,
with ``source: kubelet``, whatever policy selects the node. Runs on NodeTopology events
and every few seconds (which picks up policy changes) and on Node events (label changes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import kopf

from numalign.api.common import GROUP, VERSION
from numalign.api.effective import NodeKind
from numalign.api.kube import MERGE_PATCH, ApiError, nt_path
from numalign.api.names import SOURCE_KUBELET, SOURCE_POLICY_PREFIX
from numalign.api.reads import NodeTopologyRead
from numalign.api.resolution import (
    node_default_for,
    node_spec_from,
    policy_refs,
)

from . import cache, connection

FIELDS = ("policy", "scope", "options", "source")


def desired_spec(node_labels: Mapping[str, str], policies: Sequence[Mapping[str, Any]],
                 nt: NodeTopologyRead | Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``nt``: the node's NodeTopology (its kind, and on a real node its kubelet's
    settings, ``status.kubelet``)."""
    read = NodeTopologyRead.of(nt).with_node_labels(node_labels)
    if NodeKind.of(read) is NodeKind.KUBELET_MANAGED:
        kubelet = read.status.kubelet or {}
        return {"policy": kubelet.get("topologyManagerPolicy"),
                "scope": kubelet.get("topologyManagerScope"), "source": SOURCE_KUBELET}
    winner, _ = node_default_for(node_labels, policy_refs(policies))
    spec = node_spec_from(winner)
    if winner is not None:
        spec["source"] = SOURCE_POLICY_PREFIX + winner.name
    return spec


def spec_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch taking ``current`` spec to ``desired`` (None: nothing to do)."""
    cur = {k: current.get(k) for k in FIELDS if current.get(k) not in (None, {})}
    want = {k: desired.get(k) for k in FIELDS if desired.get(k) not in (None, {})}
    if cur == want:
        return None
    patch: dict[str, Any] = {k: want.get(k) for k in FIELDS}  # None deletes the field
    old_opts, new_opts = cur.get("options"), want.get("options")
    if isinstance(old_opts, Mapping) and isinstance(new_opts, Mapping):
        patch["options"] = {k: new_opts.get(k) for k in {*old_opts, *new_opts}}
    gen = current.get("policyGeneration")
    patch["policyGeneration"] = (gen if isinstance(gen, int) else 0) + 1
    return patch


async def reconcile_node(name: str, logger: kopf.Logger | None = None,
                         policies: Sequence[Mapping[str, Any]] | None = None) -> None:
    """Patch the node default from the cached NodeTopology, Node labels and policies; the
    patched object goes back into the cache, so a stale copy never bumps
    ``policyGeneration`` twice (a conflicting write is refused by resourceVersion)."""
    await cache.ready()
    nt = cache.node_topology(name)
    if nt is None:
        return
    labels = cache.node_labels(name) or {}
    current = nt.get("spec") or {}
    patch = spec_patch(current, desired_spec(labels, cache.policies() if policies is None
                                             else policies, nt))
    if patch is None:
        return
    rv = (nt.get("metadata") or {}).get("resourceVersion")
    body: dict[str, Any] = {"spec": patch}
    if rv:
        body["metadata"] = {"resourceVersion": rv}
    try:
        out = await connection.client().patch(nt_path(name), body, MERGE_PATCH)
    except ApiError as e:
        if e.status == 409:  # the cached copy was stale: the next event or pass retries
            cache.NODE_TOPOLOGIES.forget(name)
            obj = await connection.client().get_or_none(nt_path(name))
            if obj is not None:
                cache.NODE_TOPOLOGIES.put(obj)
            return
        if e.status == 404:
            return
        raise
    if out:
        cache.NODE_TOPOLOGIES.put(out)
    if logger is not None:
        logger.info(f"node default of {name}: {patch}")


@kopf.on.event(GROUP, VERSION, connection.NT_PLURAL, id="node-default")
async def nt_event(body: kopf.Body, name: str, type: str | None, logger: kopf.Logger,
                   **_: Any) -> None:
    cache.feed(cache.NODE_TOPOLOGIES, body, type)
    if type != "DELETED":
        await reconcile_node(name, logger)


@kopf.on.event("", "v1", "nodes", id="node-labels")
async def node_event(body: kopf.Body, name: str, type: str | None, logger: kopf.Logger,
                     **_: Any) -> None:
    cache.feed(cache.NODES, body, type, cache.slim_labels)
    if type != "DELETED":
        await reconcile_node(name, logger)


async def reconcile_all(logger: kopf.Logger | None = None) -> None:
    """Every node's default (run periodically: picks up policy changes)."""
    await cache.ready()
    policies = cache.policies()
    for nt in cache.node_topologies():
        await reconcile_node(str((nt.get("metadata") or {}).get("name", "")), logger,
                             policies)
