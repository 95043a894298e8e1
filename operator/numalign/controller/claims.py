"""The ``numa-constraint`` mutating webhook: a ResourceClaim generated for a pod whose
policy is ``single-numa-node`` gets a ``matchAttribute: resource.kubernetes.io/numaNode``
constraint over those of its requests whose devices all publish that attribute, so
kube-scheduler's allocator itself picks their devices on one NUMA node.

Why: the allocator picks a claim's devices after the scheduler extender approved the
node, and may pick any that match. Under ``single-numa-node`` the node admits the pod
only if its devices and CPUs share one NUMA node; without the constraint the extender
must refuse every node where the allocator could split a claim's devices across NUMA
nodes, even where an aligned allocation exists. With it, the extender counts the
constrained requests' devices as one NUMA node's (:mod:`numalign.extender.dradecide`).
The constraint is the API's own rule (a hard one, as single-numa-node is); the softer
policies (restricted, best-effort) have no such rule and are left alone.

Which claims: created (CREATE) with an ownerReference to a Pod (the ResourceClaim
controller generates one per ``resourceClaimTemplateName`` with it, and the annotation
``resource.kubernetes.io/pod-claim-name``); the pod is read from the API server and its
policy is its ``numalign.io/resolved`` (or resolved again when it has none). A claim
that already has a constraint, a claim shared by name (no owner pod), a pod of another
policy: unchanged.

Which requests: a device without the ``numaNode`` attribute can never satisfy the
constraint, so a request that could get such a device would risk staying unallocated
(the pod Pending forever) although the kubelet would admit it (a device of unknown NUMA
node gives the Topology Manager no hint; numalign's own decision counts it as unknown,
never refuses it). So only the requests whose every candidate device in the cluster
publishes the attribute get it (:mod:`numalign.api.draconstraint`, from the cluster's
ResourceSlices and DeviceClasses read by :mod:`numalign.controller.dradevices`); a
request whose candidates all lack it, a mixed one, one whose class is not found or that
has no candidate yet: none (a selector outside the CEL subset "may match", so any device
lacking the attribute that it may select keeps the request free). No request qualifies:
the claim is left unchanged.

Fails open: ``failurePolicy: Ignore``; any error reading the pod, or the slices and
classes, leaves the claim as it came (logged). That is the safe side: a missing
constraint only costs alignment, which the extender still checks (it decides the node
with every allocation the allocator could make) and the node still enforces under the
pod's policy; a wrong constraint strands the pod. It never refuses a claim.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any

import kopf

from numalign.api.draasks import NUMA_ATTRIBUTE
from numalign.api.draconstraint import numa_requests
from numalign.api.kube import ApiError
from numalign.api.names import ANN_RESOLVED, DRA_NUMA_CONSTRAINT_WEBHOOK
from numalign.api.resolved import Resolved, resolved_or_none

from . import connection, dradevices

log = logging.getLogger(__name__)

POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
POLICY = "single-numa-node"
MAX_REQUESTS = 32


def _map(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def owner_pod(claim: Mapping[str, Any]) -> str | None:
    """The name of the pod the claim was generated for (its Pod ownerReference), or
    None."""
    meta = _map(claim.get("metadata"))
    refs = meta.get("ownerReferences")
    for ref in refs if isinstance(refs, list) else ():
        r = _map(ref)
        if r.get("kind") == "Pod" and r.get("apiVersion") == "v1" and \
                isinstance(r.get("name"), str) and r["name"]:
            return str(r["name"])
    return None


def constraint_for(claim: Mapping[str, Any], only: Collection[str] | None = None
                   ) -> list[dict[str, Any]] | None:
    """The constraints to give the claim: one ``matchAttribute`` of the NUMA attribute
    over its requests (those named in ``only``, when given); None when it has
    constraints already, or no such requests."""
    devices = _map(_map(claim.get("spec")).get("devices"))
    if devices.get("constraints"):
        return None
    reqs = devices.get("requests")
    names = [str(_map(r).get("name")) for r in reqs[:MAX_REQUESTS]
             if isinstance(_map(r).get("name"), str)] if isinstance(reqs, list) else []
    if only is not None:
        names = [n for n in names if n in only]
    if not names:
        return None
    return [{"requests": names, "matchAttribute": NUMA_ATTRIBUTE}]


def needs_constraint(claim: Mapping[str, Any], resolved: Resolved | None) -> bool:
    """Whether a claim generated for a pod resolved to ``resolved`` gets the constraint."""
    return resolved is not None and resolved.policy == POLICY and \
        constraint_for(claim) is not None


async def pod_policy(namespace: str, name: str) -> Resolved | None:
    """The pod's resolved policy (its annotation; resolved again when it has none)."""
    pod = await connection.client().get(connection.ns_path(namespace, "pods", name))
    ann = _map(_map(pod.get("metadata")).get("annotations"))
    got = resolved_or_none(ann.get(ANN_RESOLVED))
    if got is None:
        from .pods import resolve_pod  # the pod webhook's resolution

        got = await resolve_pod(pod, namespace)
    return got


@kopf.on.mutate("resource.k8s.io", "v1", "resourceclaims", id=DRA_NUMA_CONSTRAINT_WEBHOOK,
                operations=["CREATE"], ignore_failures=True)
async def mutate_claim(body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger,
                       **_: Any) -> None:
    meta = _map(body.get("metadata"))
    namespace = str(meta.get("namespace") or "")
    pod = owner_pod(body)
    if not namespace or pod is None or constraint_for(body) is None:
        return
    try:
        resolved = await pod_policy(namespace, pod)
    except (ApiError, kopf.AdmissionError, OSError) as e:
        logger.warning(f"claim {meta.get('name') or meta.get('generateName')}: pod {pod}: "
                       f"policy not read ({e}); left without a NUMA constraint")
        return
    if not needs_constraint(body, resolved):
        return
    name = meta.get("name") or meta.get("generateName")
    cluster = await dradevices.cluster()
    if cluster is None:
        logger.warning(f"claim {name}: pod {pod}: ResourceSlices and DeviceClasses not "
                       "read; left without a NUMA constraint")
        return
    spec = dict(_map(body.get("spec")))
    constraints = constraint_for(body, numa_requests(spec, cluster))
    if constraints is None:
        logger.info(f"claim {name}: pod {pod}: no request whose devices all publish "
                    f"{NUMA_ATTRIBUTE}; left without a NUMA constraint")
        return
    devices = dict(_map(spec.get("devices")))
    devices["constraints"] = constraints
    patch.setdefault("spec", {})["devices"] = devices


__all__ = ["POD_CLAIM_ANNOTATION", "constraint_for", "mutate_claim", "needs_constraint",
           "owner_pod", "pod_policy"]
