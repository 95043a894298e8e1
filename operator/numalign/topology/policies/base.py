"""The interface every Topology Manager policy implements (the kubelet's ``Policy``: one
small type per policy). The engine asks the policy object, never its name:

- :attr:`AlignmentPolicy.aligns`: whether it merges hints at all (``none`` does not: it
  admits every pod, wants no hints and parses no options);
- :meth:`AlignmentPolicy.keep_hints`: what it keeps of a resource's hints before the merge;
- :attr:`AlignmentPolicy.closest_applies`: whether ``prefer-closest-numa-nodes`` applies;
- :attr:`AlignmentPolicy.single_numa`: only preferred hints at most one NUMA node wide can
  win (the hint generators then search no non-preferred hint, and the redeploy fit check
  asks one zone to hold the whole request);
- :meth:`AlignmentPolicy.report`: the merged hint as the policy reports it;
- :meth:`AlignmentPolicy.admits`: whether it admits the pod with that hint;
- :meth:`AlignmentPolicy.explain_merge` and :meth:`AlignmentPolicy.explain_admit`: how
  ``numalign explain`` words the two.
"""

from __future__ import annotations

from numalign.topology.hints import NumaMask, TopologyHint


class AlignmentPolicy:
    """The defaults are those of a policy that merges, keeps every hint and admits only
    preferred hints (restricted); a policy overrides what differs."""

    name: str = ""
    aligns: bool = True
    single_numa: bool = False
    closest_applies: bool = True

    def keep_hints(self, hints: tuple[TopologyHint, ...]) -> tuple[TopologyHint, ...]:
        """What the merge sees of one resource's hints (the same tuple when all kept)."""
        return hints

    def report(self, hint: TopologyHint, all_nodes: NumaMask) -> TopologyHint:
        """The merged hint as the policy reports it (and the allocation follows)."""
        return hint

    def admits(self, hint: TopologyHint) -> bool:
        return hint.preferred

    def explain_merge(self, reported_no_affinity: bool) -> str:
        """What ``explain`` adds to the why of a merge ("" when nothing)."""
        return ""

    def explain_admit(self, hint: TopologyHint, reject_reason: str) -> str:
        if self.admits(hint):
            which = "preferred hints" if hint.preferred else "this hint"
            return f"{self.name} admits {which}: admitted."
        if not hint.preferred:
            return (f"{self.name} admits only preferred hints and this one is not: "
                    f"rejected with {reject_reason}.")
        return f"{self.name} does not admit this hint: rejected with {reject_reason}."
