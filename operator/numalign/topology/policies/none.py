"""``none``: no alignment. The kubelet's none policy merges nothing (it does not even
parse the policy options) and admits every pod; CPUs, memory and devices come from any
NUMA node."""

from __future__ import annotations

from numalign.topology.hints import TopologyHint
from numalign.topology.policyconfig import POLICY_NONE

from .base import AlignmentPolicy


class NonePolicy(AlignmentPolicy):
    name = POLICY_NONE
    aligns = False

    def admits(self, hint: TopologyHint) -> bool:
        return True

    def explain_admit(self, hint: TopologyHint, reject_reason: str) -> str:
        return "none admits every pod."
