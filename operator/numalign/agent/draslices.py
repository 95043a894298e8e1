"""``numalign agent --emulate ... --dra``: each emulated node publishes its machine file's
devices as ResourceSlices of the emulated DRA driver (:mod:`numalign.api.draemulated`),
owned by its Node (deleted with it), instead of advertising them as extended resources.
No kubelet plugin is needed: kube-scheduler allocates claims from the slices alone."""

from __future__ import annotations

import dataclasses
import logging

from numalign.api.draclaims import DRA_API
from numalign.api.draemulated import resource_slices
from numalign.api.kube import ApiError, Kube, q
from numalign.topology.machine import Machine

log = logging.getLogger(__name__)

SLICES_PATH = f"{DRA_API}/resourceslices"


def without_devices(machine: Machine) -> Machine:
    """The machine as the Node advertises it in DRA mode: no extended resources."""
    return dataclasses.replace(machine, devices=())


async def publish_slices(kube: Kube, node: str, machine: Machine, node_uid: str | None) -> int:
    """Create (or replace) the node's slices; the number written."""
    slices = resource_slices(machine, node)
    for obj in slices:
        if node_uid:
            obj["metadata"]["ownerReferences"] = [{
                "apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]
        name = obj["metadata"]["name"]
        try:
            await kube.create(SLICES_PATH, obj)
        except ApiError as e:
            if e.status != 409:
                raise
            old = await kube.get(f"{SLICES_PATH}/{q(name)}")
            obj["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            await kube.put(f"{SLICES_PATH}/{q(name)}", obj)
    if slices:
        log.debug("node %s: %d ResourceSlice(s) of %d devices", node, len(slices),
                  len(machine.devices))
    return len(slices)
