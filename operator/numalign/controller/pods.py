"""Pod policy resolution: mutating + validating webhooks at creation, a backstop handler.

- ``resolve`` (mutating, CREATE): writes ``numalign.io/resolved``; for a replacement of a
  workload that was rejected recently, adds a required node affinity keeping it off the
  rejecting nodes and nodes that cannot fit it (see :mod:`.redeploy`).
- ``overrides`` (validating, CREATE): refuses a pod whose ``numalign.io/policy`` /
  ``numalign.io/scope`` override is invalid, with a message listing the allowed values.
- backstop (``@kopf.on.event``, no state written to pods): resolves pods the webhook
  missed (operator down, webhook not installed) while they are not bound, rewrites a
  deferred node-default resolution with the node's concrete default once bound, and
  emits a Warning event for an invalid override.

Failure policy: both pod webhooks are ``Ignore``. Pods must never be blocked by the
operator being down or unreachable (it runs as an ordinary Deployment that itself needs
pods to start, and the webhook would intercept every pod of the cluster, kube-system
included). What is lost while it is down: resolution at creation (the backstop handler
does it before the pod is bound, or after binding for node defaults; the agent resolves
with the same function when it admits a pod without the annotation), avoidance
affinity for replacements (the redeploy budget bounds the cost), and refusal of
invalid overrides (they get a Warning event and the rule 2/3 policy).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from numalign.api.resolution import (
    ANN_POLICY,
    ANN_RESOLVED,
    ANN_SCOPE,
    NODE_UNKNOWN,
    PodMeta,
    Resolved,
    complete_for_node,
    parse_resolved,
    policy_refs,
    resolve,
)

from . import cache, kube, redeploy

ANN_OVERRIDE_WARNED = "numalign.io/override-warning"


def resolve_pod(pod: Mapping[str, Any], namespace: str | None = None) -> Resolved:
    """Resolve with the policies, namespace labels and (if bound) node default, as the
    watch-fed cache has them."""
    meta = PodMeta.from_object(pod)
    if namespace and not meta.namespace:
        meta = PodMeta(namespace, meta.labels, meta.annotations, meta.name)
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    node_default: Mapping[str, Any] | object | None = NODE_UNKNOWN
    if node:
        nt = cache.node_topology(node)
        node_default = (nt or {}).get("spec") or None
    return resolve(meta, cache.namespace_labels(meta.namespace), policy_refs(cache.policies()),
                   node_default)  # type: ignore[arg-type]


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


@kopf.on.mutate("", "v1", "pods", id="resolve", operations=["CREATE"], ignore_failures=True)
def mutate_pod(body: kopf.Body, patch: kopf.Patch, dryrun: bool, logger: kopf.Logger,
               **_: Any) -> None:
    namespace = str(body.get("metadata", {}).get("namespace") or "")
    res = resolve_pod(body, namespace)
    patch.setdefault("metadata", {}).setdefault("annotations", {})[ANN_RESOLVED] = \
        res.annotation()
    try:
        wl = redeploy.workload_of(body, namespace) if namespace else None
        now = time.time()
        avoid = wl.avoid(now) if wl is not None else []
        held = wl.hold(now) if wl is not None else None
    except ApiException as e:
        logger.warning(f"cannot read redeploy state: {e.reason}")
        avoid, held = [], None
    if avoid:
        spec = redeploy.with_node_avoidance(dict(body.get("spec") or {}), avoid)
        if spec.get("affinity") != (body.get("spec") or {}).get("affinity"):
            patch.setdefault("spec", {})["affinity"] = spec["affinity"]
            patch["metadata"]["annotations"][redeploy.ANN_WORKLOAD] = redeploy.workload_key(
                body)
    if held is not None and not redeploy.has_gate(body):
        # A ReplicaSet (or Job) replaces a Failed pod at once. Hold the replacement while
        # the rejected pod waits out its backoff, and for good once the workload spent
        # its redeploy budget: no runaway of Failed pods (kubernetes#84869).
        gates = list((body.get("spec") or {}).get("schedulingGates") or [])
        patch.setdefault("spec", {})["schedulingGates"] = [*gates, {"name": redeploy.GATE}]
        patch["metadata"]["annotations"][redeploy.ANN_WORKLOAD] = redeploy.workload_key(body)


@kopf.on.validate("", "v1", "pods", id="overrides", operations=["CREATE"], ignore_failures=True)
def validate_pod(body: kopf.Body, **_: Any) -> None:
    ann = body.get("metadata", {}).get("annotations") or {}
    if ANN_POLICY not in ann and ANN_SCOPE not in ann:
        return
    res = resolve_pod(body)
    if res.problems:
        raise kopf.AdmissionError("; ".join(res.problems), code=422)


def _needs_backstop(body: kopf.Body, **_: Any) -> bool:
    meta = body.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return False
    phase = (body.get("status") or {}).get("phase")
    if phase in ("Succeeded", "Failed"):
        return False
    ann = meta.get("annotations") or {}
    current = parse_resolved(ann.get(ANN_RESOLVED))
    bound = bool((body.get("spec") or {}).get("nodeName"))
    if current is None:
        # Missing or malformed: fix it while the agent has not admitted the pod.
        return not bound or phase == "Pending"
    return current.deferred and bound


@kopf.on.event("", "v1", "pods", id="resolve-backstop", when=_needs_backstop)
def backstop(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    meta = body.get("metadata") or {}
    ann = meta.get("annotations") or {}
    try:
        res = resolve_pod(body)
        current = parse_resolved(ann.get(ANN_RESOLVED))
        if current is not None and current.deferred:
            nt = cache.node_topology(str(body["spec"]["nodeName"]))
            res = complete_for_node(current, (nt or {}).get("spec") or None)
        new_ann: dict[str, str | None] = {ANN_RESOLVED: res.annotation()}
        if res.problems and ann.get(ANN_OVERRIDE_WARNED) is None:
            msg = "; ".join(res.problems)
            kube.event(body, "Warning", reason="InvalidTopologyOverride",
                      message=f"{msg}; using {res.policy or 'the node default'} from {res.source}")
            new_ann[ANN_OVERRIDE_WARNED] = json.dumps(sorted(res.problems))[:1000]
        if ann.get(ANN_RESOLVED) == new_ann[ANN_RESOLVED] and len(new_ann) == 1:
            return
        kube.core().patch_namespaced_pod(
            meta["name"], meta["namespace"], {"metadata": {"annotations": new_ann}})
        logger.info(f"resolved {meta['namespace']}/{meta['name']}: {res.annotation()}")
    except ApiException as e:
        if e.status != 404:
            logger.warning(f"backstop resolution of {meta.get('name')} failed: {e.reason}")
