"""The policy the agent admits a pod with: the operator's ``numalign.io/resolved``
(:mod:`numalign.api.wire`), else the node's default."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from numalign.api.wire import ANN_RESOLVED, Resolved, WireError, parse_resolved


def resolve_pod(pod: Mapping[str, Any], default: Resolved) -> tuple[Resolved, str | None]:
    """The pod's policy: its resolved annotation, else ``default`` (the node's default,
    from its NodeTopology.spec; also when the operator deferred to it because the pod
    was not bound yet). Also the problem with a malformed annotation (then ``default``
    is used)."""
    ann = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANN_RESOLVED)
    if ann is None:
        return default, None
    try:
        resolved = parse_resolved(str(ann))
    except WireError as e:
        return default, str(e)
    return (default if resolved.deferred else resolved), None
