"""The group tree of one device resource.

Every device lists its interconnect groups outermost level first (``{socket: s0, nvlink:
nv1, pcie: sw3}``). The tree of a resource is the trie of those paths, with the device's
NUMA node as an implicit innermost level named ``numa`` (unless the devices define a
``numa`` level themselves), and the devices as leaves. Chains of single-child nodes are
collapsed, so every inner node is a distinct set of devices. The root is the machine.

Leaves are numbered in tree order, so the devices of any node are a contiguous run of
leaf indices and a set of devices is a Python ``int`` bitmask over leaf indices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..hints import mask_ids
from ..machine import Device, Machine

NUMA_LEVEL = "numa"  # implicit innermost level: the device's NUMA node
ANY_LEVEL = "any"  # sameGroup value without a group constraint


def level_order(devices: Sequence[Device]) -> list[str]:
    """All group levels of ``devices``, outermost first, merging each device's own order."""
    order: list[str] = []
    for d in devices:
        prev: str | None = None
        for lvl, _gid in d.groups:
            if lvl not in order:
                order.insert(order.index(prev) + 1 if prev is not None else 0, lvl)
            prev = lvl
    return order


def group_of(device: Device, level: str) -> str | None:
    """The device's group id at ``level``; ``numa`` falls back to its NUMA node."""
    gid = device.group(level)
    if gid is None and level == NUMA_LEVEL and device.numa_node is not None:
        return str(device.numa_node)
    return gid


@dataclass
class Node:
    """A group of devices: the leaves ``lo .. hi-1`` of the tree."""

    index: int
    parent: int | None
    depth: int
    lo: int
    hi: int
    children: list[int] = field(default_factory=list)
    common: dict[str, str] = field(default_factory=dict)  # level -> group id shared by all
    label: str = ""

    @property
    def size(self) -> int:
        return self.hi - self.lo

    @property
    def mask(self) -> int:
        return ((1 << self.hi) - 1) ^ ((1 << self.lo) - 1)

    @property
    def is_leaf(self) -> bool:
        return not self.children


@dataclass
class GroupTree:
    """The group tree of one resource on one machine (see the module docstring)."""

    resource: str
    levels: list[str]  # explicit levels, outermost first (``numa`` not included)
    devices: list[Device]  # leaf order
    nodes: list[Node]  # nodes[0] is the root; parents come before their children
    leaf_node: list[int]  # leaf index -> node index
    index: dict[str, int]  # device id -> leaf index
    numa_masks: dict[int, int]  # NUMA node -> leaf bitmask of its devices
    no_numa: int  # leaf bitmask of devices without a NUMA node

    @property
    def all_mask(self) -> int:
        return (1 << len(self.devices)) - 1

    def leaves(self, bits: int) -> list[int]:
        return mask_ids(bits)

    def ids(self, bits: int) -> list[str]:
        return [self.devices[i].id for i in self.leaves(bits)]

    def bits_of(self, ids: Sequence[str]) -> int:
        b = 0
        for i in ids:
            if i in self.index:
                b |= 1 << self.index[i]
        return b

    def within_numa(self, numa_mask: int | None) -> int:
        """Leaves allowed under a NUMA mask: on a node of the mask, or without NUMA node."""
        if numa_mask is None:
            return self.all_mask
        bits = self.no_numa
        for n, m in self.numa_masks.items():
            if numa_mask >> n & 1:
                bits |= m
        return bits

    def numa_of(self, bits: int) -> int:
        """The NUMA mask of a set of leaves (devices without a NUMA node add nothing)."""
        out = 0
        for n, m in self.numa_masks.items():
            if bits & m:
                out |= 1 << n
        return out

    def lca(self, bits: int) -> Node:
        """The smallest node holding every leaf of ``bits`` (non-empty)."""
        node = self.nodes[0]
        while True:
            for c in node.children:
                child = self.nodes[c]
                if bits & ~child.mask == 0:
                    node = child
                    break
            else:
                return node

    def memory_mask(self, min_memory: int) -> int:
        bits = 0
        for i, d in enumerate(self.devices):
            if min_memory <= 0 or (d.memory is not None and d.memory >= min_memory):
                bits |= 1 << i
        return bits

    def group_mask(self, level: str, gid: str) -> int:
        bits = 0
        for i, d in enumerate(self.devices):
            if group_of(d, level) == gid:
                bits |= 1 << i
        return bits

    def has_level(self, level: str) -> bool:
        return any(group_of(d, level) is not None for d in self.devices)


def build_tree(machine: Machine, resource: str) -> GroupTree:
    """The group tree of ``resource`` on ``machine``."""
    devs = machine.devices_of(resource)
    levels = level_order(devs)
    paths: list[tuple[tuple[str, str], ...]] = []
    for d in devs:
        steps = [(lvl, gid) for lvl in levels if (gid := d.group(lvl)) is not None]
        if NUMA_LEVEL not in levels and d.numa_node is not None:
            steps.append((NUMA_LEVEL, str(d.numa_node)))
        paths.append(tuple(steps))
    # Trie with children in first-appearance order; leaves in depth-first order.
    trie: dict[tuple[tuple[str, str], ...], list[tuple[tuple[str, str], ...]]] = {(): []}
    members: dict[tuple[tuple[str, str], ...], list[int]] = {(): []}
    for di, path in enumerate(paths):
        for k in range(len(path) + 1):
            pre = path[:k]
            if pre not in trie:
                trie[pre] = []
                members[pre] = []
                trie[path[: k - 1]].append(pre)
        members[path].append(di)

    order: list[Device] = []
    nodes: list[Node] = []
    leaf_node: list[int] = []

    def walk(pre: tuple[tuple[str, str], ...], parent: int | None, depth: int) -> None:
        # Collapse chains: a node with one child and no devices of its own is that child.
        while len(trie[pre]) == 1 and not members[pre]:
            pre = trie[pre][0]
        kids = trie[pre]
        direct = members[pre]
        if parent is not None and not kids and len(direct) == 1:
            # A group of one device is just the device.
            order.append(devs[direct[0]])
            li = len(nodes)
            nodes.append(Node(index=li, parent=parent, depth=depth, lo=len(order) - 1,
                              hi=len(order), label=devs[direct[0]].id))
            nodes[parent].children.append(li)
            leaf_node.append(li)
            return
        me = len(nodes)
        lo = len(order)
        node = Node(index=me, parent=parent, depth=depth, lo=lo, hi=lo,
                    label="/".join(f"{lvl}={gid}" for lvl, gid in pre) or "machine")
        nodes.append(node)
        if parent is not None:
            nodes[parent].children.append(me)
        for di in direct:
            li = len(nodes)
            order.append(devs[di])
            nodes.append(Node(index=li, parent=me, depth=depth + 1, lo=len(order) - 1,
                              hi=len(order), label=devs[di].id))
            node.children.append(li)
            leaf_node.append(li)
        for k in kids:
            walk(k, me, depth + 1)
        node.hi = len(order)

    walk((), None, 0)
    all_levels = [*levels, *([] if NUMA_LEVEL in levels else [NUMA_LEVEL])]
    for node in nodes:
        ds = order[node.lo:node.hi]
        for lvl in all_levels:
            gids = {group_of(d, lvl) for d in ds}
            if len(gids) == 1 and (g := next(iter(gids))) is not None:
                node.common[lvl] = g
    numa_masks: dict[int, int] = {}
    no_numa = 0
    for i, d in enumerate(order):
        if d.numa_node is None:
            no_numa |= 1 << i
        else:
            numa_masks[d.numa_node] = numa_masks.get(d.numa_node, 0) | 1 << i
    return GroupTree(resource=resource, levels=levels, devices=order, nodes=nodes,
                     leaf_node=leaf_node, index={d.id: i for i, d in enumerate(order)},
                     numa_masks=numa_masks, no_numa=no_numa)
