"""``best-effort``: merge the hints, admit whatever hint wins."""

from __future__ import annotations

from numalign.topology.hints import TopologyHint
from numalign.topology.policyconfig import POLICY_BEST_EFFORT

from .base import AlignmentPolicy


class BestEffortPolicy(AlignmentPolicy):
    name = POLICY_BEST_EFFORT

    def admits(self, hint: TopologyHint) -> bool:
        return True

    def explain_admit(self, hint: TopologyHint, reject_reason: str) -> str:
        return "best-effort admits whatever hint wins."
