"""Node defaults: push the policy selected by ``nodeSelector`` into NodeTopology.spec.

For each NodeTopology (one per node, named after it), the valid TopologyPolicies whose
``nodeSelector`` matches the Node's labels are ranked (priority, then nodeSelector size,
then name, :func:`.resolution.node_default_for`); the winner's policy, scope and options
become ``spec`` with ``source: TopologyPolicy/<name>``, and ``policyGeneration`` is
bumped on every change (the agent echoes it in ``status.observedPolicyGeneration``).
No matching policy clears the default. Runs on NodeTopology events and every few
seconds (which picks up policy changes) and on Node events (label changes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from numalign.api.resolution import (
    SOURCE_POLICY_PREFIX,
    node_default_for,
    node_spec_from,
    policy_refs,
)

from . import kube

FIELDS = ("policy", "scope", "options", "source")


def desired_spec(node_labels: Mapping[str, str],
                 policies: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
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


def reconcile_node(name: str, logger: kopf.Logger | None = None) -> None:
    nt = kube.get_node_topology(name)
    if nt is None:
        return
    try:
        node = kube.core().read_node(name)
        labels = dict(node.metadata.labels or {})
    except ApiException as e:
        if e.status != 404:
            raise
        labels = {}
    patch = spec_patch(nt.get("spec") or {}, desired_spec(labels, kube.list_policies()))
    if patch is None:
        return
    kube.custom().patch_cluster_custom_object(
        kube.GROUP, kube.VERSION, kube.NT_PLURAL, name, {"spec": patch})
    if logger is not None:
        logger.info(f"node default of {name}: {patch}")


@kopf.on.event(kube.GROUP, kube.VERSION, kube.NT_PLURAL, id="node-default")
def nt_event(name: str, type: str | None, logger: kopf.Logger, **_: Any) -> None:
    if type != "DELETED":
        reconcile_node(name, logger)


@kopf.on.event("", "v1", "nodes", id="node-labels")
def node_event(name: str, type: str | None, logger: kopf.Logger, **_: Any) -> None:
    if type != "DELETED":
        reconcile_node(name, logger)


def reconcile_all(logger: kopf.Logger | None = None) -> None:
    """Every node's default (run periodically: picks up policy changes)."""
    for nt in kube.list_node_topologies():
        reconcile_node(str((nt.get("metadata") or {}).get("name", "")), logger)
