"""TopologyPolicy validation and status; validating webhook for cross-object rules.

Status (``status`` subresource): conditions ``Valid`` (what is wrong, if anything),
``Conflicting`` (another policy of equal priority and specificity can select the same
pods in an existing namespace), ``RedeployExhausted`` (pods left Failed after
``redeploy.maxAttempts``), ``matchedNamespaces`` / ``namespaceSummary``,
``admittedPods`` (NodeTopology admitted entries under this policy, directly or as a
node default), ``rejectedPods`` (TopologyAffinityError rejections the redeployer
recorded for this policy's workloads) and ``observedGeneration``.

The validating webhook (``Ignore`` on failure: the schema and CEL rules still hold and
conflicts still show in status) refuses a policy that conflicts with an existing one,
and anything :func:`.resolution.policy_problems` finds that the schema let through.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf

from numalign.api.common import GROUP, VERSION
from numalign.api.kube import MERGE_PATCH, ApiError
from numalign.api.names import SOURCE_POLICY_PREFIX
from numalign.api.resolution import (
    PolicyRef,
    conflicts,
    matched_namespaces,
    policy_problems,
    policy_refs,
)

from . import cache, connection, redeploy


def _condition(old: list[Mapping[str, Any]], type_: str, status: str, reason: str,
               message: str, generation: int | None, now: str) -> dict[str, Any]:
    prev = next((c for c in old if c.get("type") == type_), None)
    stamp = now if prev is None or prev.get("status") != status else (
        prev.get("lastTransitionTime") or now)
    cond: dict[str, Any] = {"type": type_, "status": status, "reason": reason,
                            "message": message, "lastTransitionTime": stamp}
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def _summary(names: list[str], every: bool, limit: int = 3) -> str:
    if every:
        return "*"
    if len(names) <= limit:
        return ",".join(names)
    return ",".join(names[:limit]) + f",+{len(names) - limit}"


def compute_status(obj: Mapping[str, Any], policies: list[PolicyRef],
                   namespaces: Mapping[str, Mapping[str, str]],
                   node_topologies: Sequence[Mapping[str, Any]],
                   redeploy_states: list[redeploy.WorkloadState]) -> dict[str, Any]:
    """The status of one TopologyPolicy (pure; timestamps preserved when unchanged)."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    spec = obj.get("spec") or {}
    gen = meta.get("generation")
    old_conds = list(((obj.get("status") or {}).get("conditions")) or [])
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ref = PolicyRef(name, spec)
    problems = list(ref.problems)
    rivals = conflicts(policies, namespaces).get(name, [])
    source = SOURCE_POLICY_PREFIX + name
    admitted = 0
    for nt in node_topologies:
        node_src = (nt.get("spec") or {}).get("source")
        for a in ((nt.get("status") or {}).get("admitted")) or []:
            if not isinstance(a, Mapping):
                continue
            if a.get("source") == source or (a.get("source") == "node-default"
                                             and node_src == source):
                admitted += 1
    mine = [s for s in redeploy_states if s.policy == name]
    rejected = sum(len(s.handled or {}) + len(s.gave_up or {}) + len(s.released or {})
                   for s in mine)
    gave_up = sum(len(s.gave_up or {}) for s in mine)
    conds = [
        _condition(old_conds, "Valid", "False" if problems else "True",
                   "Invalid" if problems else "Valid",
                   "; ".join(problems) if problems else "the policy is usable", gen, now),
        _condition(old_conds, "Conflicting", "True" if rivals else "False",
                   "EqualPriorityAndSpecificity" if rivals else "NoConflict",
                   (f"equal priority and specificity with {', '.join(rivals)} for the same pods;"
                    " the lexically smaller name wins") if rivals else "", gen, now),
        _condition(old_conds, "RedeployExhausted", "True" if gave_up else "False",
                   "MaxAttemptsReached" if gave_up else "WithinLimits",
                   f"{gave_up} rejected pod(s) not redeployed after redeploy.maxAttempts"
                   if gave_up else "", gen, now),
    ]
    every = not spec.get("namespaces") and spec.get("namespaceSelector") is None
    names = matched_namespaces(ref, namespaces)
    status: dict[str, Any] = {
        "conditions": conds,
        "matchedNamespaces": names,
        "namespaceSummary": _summary(names, every and not problems),
        "admittedPods": admitted,
        "rejectedPods": rejected,
    }
    if isinstance(gen, int):
        status["observedGeneration"] = gen
    return status


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    def strip(s: Mapping[str, Any]) -> dict[str, Any]:
        d = dict(s)
        d["conditions"] = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                           for c in d.get("conditions") or []]
        return d
    return strip(a) == strip(b)


def all_redeploy_states() -> list[redeploy.WorkloadState]:
    return [redeploy.WorkloadState.parse(v) for cm in cache.all_states()
            for v in (cm.get("data") or {}).values()]


@dataclass
class _Inputs:
    """What every policy's status is computed from (read once per pass, from the cache)."""

    items: list[dict[str, Any]]
    namespaces: dict[str, dict[str, str]]
    node_topologies: list[dict[str, Any]]
    states: list[redeploy.WorkloadState]

    @classmethod
    async def read(cls) -> _Inputs:
        await cache.ready()
        return cls(cache.policies(), cache.all_namespace_labels(), cache.node_topologies(),
                   all_redeploy_states())


async def reconcile_status(name: str, logger: kopf.Logger | None = None,
                           inputs: _Inputs | None = None) -> None:
    inp = inputs or await _Inputs.read()
    obj = next((o for o in inp.items if (o.get("metadata") or {}).get("name") == name), None)
    if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
        return
    status = compute_status(obj, policy_refs(inp.items), inp.namespaces, inp.node_topologies,
                            inp.states)
    if _same(status, obj.get("status") or {}):
        return
    try:
        out = await connection.client().patch(connection.tp_path(name, "status"),
                                              {"status": status}, MERGE_PATCH)
        if out:
            cache.TOPOLOGY_POLICIES.put(out)
    except ApiError as e:
        if e.status != 404 and logger is not None:
            logger.warning(f"cannot update status of TopologyPolicy/{name}: {e.status} "
                           f"{e.reason}")


@kopf.on.event(GROUP, VERSION, connection.TP_PLURAL, id="policy-status")
async def policy_event(body: kopf.Body, name: str, type: str | None, logger: kopf.Logger,
                       **_: Any) -> None:
    cache.feed(cache.TOPOLOGY_POLICIES, body, type)
    if type == "DELETED":
        return
    await reconcile_status(name, logger)


async def reconcile_all(logger: kopf.Logger | None = None) -> None:
    """Every policy's status (run periodically: counts change without policy events)."""
    inputs = await _Inputs.read()
    for obj in inputs.items:
        await reconcile_status(str((obj.get("metadata") or {}).get("name", "")), logger,
                               inputs)


@kopf.on.validate(GROUP, VERSION, connection.TP_PLURAL, id="policy-overlaps",
                  operations=["CREATE", "UPDATE"], ignore_failures=True)
async def validate_policy(body: kopf.Body, **_: Any) -> None:
    spec = dict(body.get("spec") or {})
    name = str((body.get("metadata") or {}).get("name", ""))
    problems = policy_problems(spec)
    if problems:
        raise kopf.AdmissionError("; ".join(problems), code=422)
    # Read live, not from the cache: two policies created at once must see each other.
    items, _rv = await connection.list_items(connection.TP_BASE)
    namespaces, _rv = await connection.client().list_all("/api/v1/namespaces")
    labels = {str(n["metadata"]["name"]): dict(n["metadata"].get("labels") or {})
              for n in namespaces}
    others = [p for p in policy_refs(items) if p.name != name]
    rivals = conflicts([*others, PolicyRef(name, spec)], labels).get(name)
    if rivals:
        raise kopf.AdmissionError(
            f"spec.priority: TopologyPolicy {name} would conflict with {', '.join(rivals)}: "
            "equal priority and equally specific selectors match the same pods; give one a "
            "different priority or a more specific podSelector / namespace selection",
            code=422)
