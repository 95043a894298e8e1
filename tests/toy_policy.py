"""A toy fifth Topology Manager policy, registered only by the tests that need it:
``at-most-two`` admits a preferred merged hint at most two NUMA nodes wide.

As a plugin (``NUMALIGN_POLICY_MODULES=toy_policy`` with the tests folder on
``PYTHONPATH``) the loader takes the module's ``POLICIES``."""

from __future__ import annotations

from numalign.topology.hints import TopologyHint
from numalign.topology.policies import AlignmentPolicy

NAME = "at-most-two"


class AtMostTwo(AlignmentPolicy):
    """Admits a preferred hint at most two NUMA nodes wide."""

    name = NAME

    def admits(self, hint: TopologyHint) -> bool:
        return hint.preferred and (hint.mask is None or hint.mask.bit_count() <= 2)


POLICIES = (AtMostTwo(),)
