"""The pods the extender may decide: the unbound pods of the schedulers it serves, as
the API server has them (a watch of ``spec.nodeName=``), kept slim.

Nothing a request body says about a pod is trusted: filter decides, and bind binds, the
pod this watch shows under the uid the request names (its spec, its annotations), and
only while it is unbound and names one of :attr:`PendingPods.schedulers`. A pod the
watch has not shown yet (the scheduler's informer can be a little ahead of ours) is
read from the API server once (:meth:`PendingPods.lookup`), with a bound on how many
such reads run at once. A made-up uid, another scheduler's pod or a pod already bound is
refused: nothing of it is decided, counted in flight or kept.

:func:`slim` keeps of a pod only what the extender's decision and its bookkeeping read,
so what is kept per pod is bounded by the pod's resources and two annotations, not by
its whole object (large ``last-applied-configuration`` annotations, managed fields).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from numalign.api.kube import ApiError, Kube
from numalign.api.kube.client import TRANSPORT_ERRORS, pod_path
from numalign.api.names import ANN_GPUS, ANN_RESOLVED

log = logging.getLogger("numalign.extender")

JSON = dict[str, Any]
UNBOUND = {"fieldSelector": "spec.nodeName="}
DEFAULT_SCHEDULERS = frozenset({"default-scheduler"})
LOOKUP_TIMEOUT = 1.0  # seconds: a pod the watch has not shown yet, read directly
MAX_LOOKUPS = 4  # such reads at once; more are refused (the scheduler goes on without us)
# what of a pod the extender reads: the decision (the resolved policy, the GPU request,
# the containers' resources), the reservation (names) and the bookkeeping (phase)
KEPT_ANNOTATIONS = (ANN_RESOLVED, ANN_GPUS)
KEPT_CONTAINER_FIELDS = ("name", "resources", "restartPolicy")


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def slim(pod: Mapping[str, Any]) -> JSON:
    """What the extender keeps of ``pod``: name, namespace, uid, resourceVersion, the
    annotations it reads, the containers' names, resources and restart policies, the
    scheduler and node names, the phase, the pod's claims and the names of the claims
    generated for it."""
    meta = _mapping(pod.get("metadata"))
    spec = _mapping(pod.get("spec"))
    ann = _mapping(meta.get("annotations"))

    def containers(raw: Any) -> Any:
        if not isinstance(raw, list):
            return raw
        return [{k: c[k] for k in KEPT_CONTAINER_FIELDS if k in c}
                if isinstance(c, Mapping) else c for c in raw]

    out_meta: JSON = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion")
                      if k in meta}
    kept = {k: ann[k] for k in KEPT_ANNOTATIONS if k in ann}
    if kept:
        out_meta["annotations"] = kept
    out_spec: JSON = {"containers": containers(spec.get("containers"))}
    if spec.get("initContainers"):
        out_spec["initContainers"] = containers(spec.get("initContainers"))
    for k in ("schedulerName", "nodeName", "resourceClaims"):
        if spec.get(k):
            out_spec[k] = spec[k]
    out: JSON = {"metadata": out_meta, "spec": out_spec}
    status = _mapping(pod.get("status"))
    kept_status = {k: status[k] for k in ("phase", "resourceClaimStatuses") if status.get(k)}
    if kept_status:
        out["status"] = kept_status
    return out


@dataclass(frozen=True)
class Refusal:
    """Why a request's pod is not one the extender decides (the answer's ``Error``)."""

    message: str


class PendingPods:
    """The unbound pods of ``schedulers`` by uid, slim (see the module docstring)."""

    def __init__(self, schedulers: Iterable[str] = DEFAULT_SCHEDULERS,
                 kube: Kube | None = None, max_lookups: int = MAX_LOOKUPS) -> None:
        self.schedulers = frozenset(schedulers)
        self.kube = kube
        self._by_uid: dict[str, JSON] = {}
        self._lookups = asyncio.Semaphore(max_lookups)
        self.looked_up = 0  # pods read from the API server (the watch had not shown them)

    def __len__(self) -> int:
        return len(self._by_uid)

    def get(self, uid: str) -> JSON | None:
        return self._by_uid.get(uid)

    def ours(self, pod: Mapping[str, Any]) -> bool:
        """Unbound, not finished, of one of our schedulers."""
        spec = _mapping(pod.get("spec"))
        phase = _mapping(pod.get("status")).get("phase")
        return (not spec.get("nodeName") and phase not in ("Succeeded", "Failed")
                and str(spec.get("schedulerName") or "default-scheduler") in self.schedulers)

    # ------------------------------------------------------------ the watch

    def event(self, event: str, pod: Mapping[str, Any]) -> None:
        """A watch event of an unbound pod (a pod bound since leaves the watch as
        DELETED)."""
        uid = _mapping(pod.get("metadata")).get("uid")
        if not isinstance(uid, str) or not uid:
            return
        if event == "DELETED" or not self.ours(pod):
            self._by_uid.pop(uid, None)
            return
        self._by_uid[uid] = slim(pod)

    def load(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A full listing: what it lacks is forgotten."""
        self._by_uid = {}
        for pod in items:
            self.event("ADDED", pod)

    def forget(self, uid: str) -> None:
        """The pod was bound (by the bind verb, or seen bound)."""
        self._by_uid.pop(uid, None)

    # ------------------------------------------------------------ a request's pod

    async def lookup(self, uid: str, namespace: str, name: str) -> JSON | Refusal:
        """The pod a request names by uid (and namespace/name), as the API server has
        it: from the watch, else read once; a :class:`Refusal` when it is not an unbound
        pod of our schedulers under that uid."""
        who = f"pod {namespace}/{name} ({uid})"
        pod = self._by_uid.get(uid)
        if pod is None:
            if not uid:
                return Refusal(f"numalign extender: {who}: the request names no pod uid")
            got = await self._read(namespace, name, who)
            if isinstance(got, Refusal):
                return got
            pod = got
        meta = _mapping(pod.get("metadata"))
        if meta.get("uid") != uid:
            return Refusal(f"numalign extender: {who}: no such pod (the API server's pod of "
                           "that name has another uid)")
        if (meta.get("namespace") or "default", meta.get("name")) != (namespace, name):
            return Refusal(f"numalign extender: {who}: the uid names pod "
                           f"{meta.get('namespace')}/{meta.get('name')}")
        if not self.ours(pod):
            return Refusal(f"numalign extender: {who}: not an unbound pod of the schedulers "
                           f"this extender serves ({', '.join(sorted(self.schedulers))})")
        return pod

    async def _read(self, namespace: str, name: str, who: str) -> JSON | Refusal:
        if self.kube is None:
            return Refusal(f"numalign extender: {who}: not a pending pod of the API server")
        if self._lookups.locked():
            return Refusal(f"numalign extender: {who}: not seen on the pod watch yet, and "
                           f"{MAX_LOOKUPS} reads of such pods are under way")
        async with self._lookups:
            try:
                got = await asyncio.wait_for(self.kube.get_or_none(pod_path(namespace, name)),
                                             LOOKUP_TIMEOUT)
            except (ApiError, TimeoutError, *TRANSPORT_ERRORS) as e:
                return Refusal(f"numalign extender: {who}: cannot read it from the API "
                               f"server: {e}")
        self.looked_up += 1
        if got is None:
            return Refusal(f"numalign extender: {who}: no such pod in the API server")
        return slim(got)
