"""Topology hints as the kubelet's Topology Manager has them.

A NUMA mask is a Python ``int`` whose bit ``i`` is set when NUMA node id ``i`` is in
the set (ids may be sparse, up to 255). ``None`` stands for the kubelet's nil
mask ("any NUMA node").
"""

from __future__ import annotations

from dataclasses import dataclass

NumaMask = int


def mask_of(ids: list[int] | tuple[int, ...] | set[int]) -> NumaMask:
    m = 0
    for i in ids:
        m |= 1 << i
    return m


def mask_ids(mask: NumaMask) -> list[int]:
    out: list[int] = []
    i = 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return out


def mask_count(mask: NumaMask) -> int:
    return mask.bit_count()


@dataclass(frozen=True, slots=True)
class TopologyHint:
    """A provider's hint: NUMA affinity (None = no preference) and whether it is preferred."""

    mask: NumaMask | None
    preferred: bool

    def to_json(self) -> dict[str, object]:
        return {"numaNodes": None if self.mask is None else mask_ids(self.mask),
                "preferred": self.preferred}


# One provider's answer: resource name -> hints. A missing provider output (None or an
# empty dict) or a resource whose list is None means "no preference"; an empty list
# means "cannot satisfy".
ProviderHints = dict[str, list[TopologyHint] | None] | None
