"""NodeTopology objects as the API server returns them, for the tests of who decides a
pod on a node (``numalign.api.effective``): a spec, the kubelet's settings a real node
publishes, and the ``NRIPlacement`` condition of an NRI-managed one."""

from __future__ import annotations

from typing import Any

from numalign.api.nodetopology import NRI_PLACEMENT


def nodetopology(spec: dict[str, Any] | None = None, kubelet: Any = None,
                 placement: tuple[str, str] | None = None) -> dict[str, Any]:
    """Node ``n``'s NodeTopology: ``kubelet`` its ``status.kubelet``, ``placement`` the
    (status, reason) of its ``NRIPlacement`` condition."""
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True"}]}
    if kubelet is not None:
        status["kubelet"] = kubelet
    if placement is not None:
        status["conditions"].append({"type": NRI_PLACEMENT, "status": placement[0],
                                     "reason": placement[1]})
    return {"metadata": {"name": "n", "resourceVersion": "7"}, "spec": spec or {},
            "status": status}
