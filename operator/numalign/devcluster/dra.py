"""``numalign dev up --dra``: the DeviceClasses of the emulated DRA driver, one per device
kind of the emulated nodes' machine files (the agent, started with ``--dra``, publishes
the devices as ResourceSlices; see :mod:`numalign.agent.draslices`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from ..api.draemulated import DRIVER, device_classes
from ..api.kube import ApiError, SyncKube
from ..topology.machine import load_machine

CLASSES_PATH = "/apis/resource.k8s.io/v1/deviceclasses"


def install_device_classes(kube: SyncKube, machine_files: Iterable[Path],
                           say: Callable[[str], None], driver: str = DRIVER) -> list[str]:
    """Create (or replace) the DeviceClasses for the machine files' device kinds (of
    ``driver``: the emulated one, or the real node's kubelet plugin); their names."""
    resources = {d.resource for p in machine_files for d in load_machine(p).devices}
    names: list[str] = []
    for obj in device_classes(resources, driver):
        name = obj["metadata"]["name"]
        try:
            kube.create(CLASSES_PATH, obj)
        except ApiError as e:
            if e.status != 409:
                raise
            old = kube.get(f"{CLASSES_PATH}/{name}")
            obj["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
            kube.put(f"{CLASSES_PATH}/{name}", obj)
        names.append(name)
    if names:
        who = "the emulated driver" if driver == DRIVER else f"driver {driver}"
        say(f"DRA: DeviceClasses of {who} installed: {', '.join(names)}")
    return names
