"""``restricted``: merge the hints, admit only a preferred one (the interface's default)."""

from __future__ import annotations

from numalign.topology.policyconfig import POLICY_RESTRICTED

from .base import AlignmentPolicy


class RestrictedPolicy(AlignmentPolicy):
    name = POLICY_RESTRICTED
