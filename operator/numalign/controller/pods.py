"""Pod policy resolution: the mutating webhook writes ``numalign.io/resolved`` (and, for
a replacement of a rejected workload, the avoiding node affinity and the redeploy gate),
the validating webhook refuses invalid overrides, and a backstop handler resolves the
pods the webhooks missed and completes deferred node defaults once bound. The webhooks
fail open; what is lost while the operator is down is in the README ("When the operator
is down")."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

import kopf

from numalign.api.effective import NodePolicy, pod_or_node_default
from numalign.api.kube import STRATEGIC_PATCH, ApiError
from numalign.api.names import (
    ANN_OVERRIDE_WARNED,
    ANN_POLICY,
    ANN_RESOLVED,
    ANN_SCOPE,
    EVENT_INVALID_OVERRIDE,
)
from numalign.api.resolution import (
    NODE_UNKNOWN,
    PodMeta,
    policy_refs,
    resolve,
)
from numalign.api.resolved import Resolved, resolved_or_none

from . import cache, connection, redeploy

# Who may create a pod that carries its own numalign.io/resolved: cluster admins and the
# ServiceAccounts of the operator's namespace (the admission policy
# numalign-pod-annotations trusts the same; config/tenancy).
TRUSTED_GROUPS = ("system:masters",)


def may_set_resolved(userinfo: Mapping[str, Any] | None) -> bool:
    """Whether the creator of a pod may give it its own ``numalign.io/resolved``."""
    groups = set((userinfo or {}).get("groups") or [])
    own = os.environ.get("POD_NAMESPACE")
    return bool(groups & set(TRUSTED_GROUPS)) or bool(
        own and f"system:serviceaccounts:{own}" in groups)


async def resolve_pod(pod: Mapping[str, Any], namespace: str | None = None) -> Resolved:
    """Resolve with the policies, namespace labels and (if bound) node default, as the
    watch-fed cache has them."""
    await cache.ready()
    meta = PodMeta.from_object(pod)
    if namespace and not meta.namespace:
        meta = PodMeta(namespace, meta.labels, meta.annotations, meta.name)
    await cache.know_namespace(meta.namespace)
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
async def mutate_pod(body: kopf.Body, patch: kopf.Patch, dryrun: bool, logger: kopf.Logger,
                     userinfo: Mapping[str, Any] | None = None, **_: Any) -> None:
    namespace = str(body.get("metadata", {}).get("namespace") or "")
    if ANN_RESOLVED in (body.get("metadata", {}).get("annotations") or {}) and not (
            may_set_resolved(userinfo)):
        # The admission policy cannot tell a creator's value from the one written here.
        raise kopf.AdmissionError(
            f"{ANN_RESOLVED} is numalign's: only its operator and agents may set it, not "
            f"{(userinfo or {}).get('username') or 'this user'} (remove it from the pod or "
            "its template)", code=403)
    res = await resolve_pod(body, namespace)
    patch.setdefault("metadata", {}).setdefault("annotations", {})[ANN_RESOLVED] = \
        res.annotation()
    try:
        wl = await redeploy.workload_of(body, namespace) if namespace else None
        now = time.time()
        avoid = wl.avoid(now) if wl is not None else []
        held = wl.hold(now) if wl is not None else None
        seen = wl is not None and wl.settings.enabled
    except ApiError as e:
        logger.warning(f"cannot read redeploy state: {e.status} {e.reason}")
        avoid, held, seen = [], None, False
    if seen:
        # Admitted by the operator, which keeps it off the nodes that rejected its
        # workload: its own rejection counts towards the budget. A pod without this mark
        # came while the webhook was away; rejected by a node that rejected the workload
        # already, it is a repeat (controller.redeploy.record.repeats_a_counted_rejection).
        patch["metadata"]["annotations"][redeploy.ANN_WORKLOAD] = redeploy.workload_key(body)
    if avoid:
        spec = redeploy.with_node_avoidance(dict(body.get("spec") or {}), avoid)
        if spec.get("affinity") != (body.get("spec") or {}).get("affinity"):
            patch.setdefault("spec", {})["affinity"] = spec["affinity"]
    if held is not None and not redeploy.has_gate(body):
        # A ReplicaSet (or Job) replaces a Failed pod at once. Hold the replacement while
        # the rejected pod waits out its backoff, and for good once the workload spent
        # its redeploy budget: no runaway of Failed pods (kubernetes#84869).
        gates = list((body.get("spec") or {}).get("schedulingGates") or [])
        patch.setdefault("spec", {})["schedulingGates"] = [*gates, {"name": redeploy.REDEPLOY_GATE}]


@kopf.on.validate("", "v1", "pods", id="overrides", operations=["CREATE"], ignore_failures=True)
async def validate_pod(body: kopf.Body, **_: Any) -> None:
    ann = body.get("metadata", {}).get("annotations") or {}
    if ANN_POLICY not in ann and ANN_SCOPE not in ann:
        return
    res = await resolve_pod(body)
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
    current = resolved_or_none(ann.get(ANN_RESOLVED))
    bound = bool((body.get("spec") or {}).get("nodeName"))
    if current is None:
        # Missing or malformed: fix it while the agent has not admitted the pod.
        return not bound or phase == "Pending"
    return current.deferred and bound


@kopf.on.event("", "v1", "pods", id="resolve-backstop", when=_needs_backstop)
async def backstop(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    meta = body.get("metadata") or {}
    ann = meta.get("annotations") or {}
    try:
        res = await resolve_pod(body)
        current = resolved_or_none(ann.get(ANN_RESOLVED))
        if current is not None and current.deferred:
            nt = cache.node_topology(str(body["spec"]["nodeName"]))
            # the node's default, as every decider reads it (numalign.api.effective)
            res = pod_or_node_default(current, NodePolicy.from_nodetopology(nt).default)[0]
        new_ann: dict[str, str | None] = {ANN_RESOLVED: res.annotation()}
        if res.problems and ann.get(ANN_OVERRIDE_WARNED) is None:
            msg = "; ".join(res.problems)
            await connection.event(body, "Warning", reason=EVENT_INVALID_OVERRIDE,
                      message=f"{msg}; using {res.policy or 'the node default'} from {res.source}")
            new_ann[ANN_OVERRIDE_WARNED] = json.dumps(sorted(res.problems))[:1000]
        if ann.get(ANN_RESOLVED) == new_ann[ANN_RESOLVED] and len(new_ann) == 1:
            return
        await connection.client().patch(connection.ns_path(meta["namespace"], "pods", meta["name"]),
                                  {"metadata": {"annotations": new_ann}}, STRATEGIC_PATCH)
        logger.info(f"resolved {meta['namespace']}/{meta['name']}: {res.annotation()}")
    except ApiError as e:
        if e.status != 404:
            logger.warning(f"backstop resolution of {meta.get('name')} failed: {e.status} "
                           f"{e.reason}")
