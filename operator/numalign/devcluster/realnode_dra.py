"""The real node's devices through DRA (``numalign dev up --real-node --dra``): the
DeviceClasses of the real node's driver, then its kubelet plugin
(:mod:`numalign.devcluster.draplugin`, ``numalign dev dra-plugin``) started beside the
kubelet, and a wait until its ResourceSlices are published (it publishes them once the
kubelet has registered it)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..api.kube import REQUEST_ERRORS
from .cluster import Log
from .dra import install_device_classes
from .draplugin import DRIVER, SLICES_PATH

if TYPE_CHECKING:
    from .realnode import RealNode


def published_slices(node: RealNode) -> int:
    """How many ResourceSlices of the real node's driver its node has."""
    try:
        items, _ = node.cluster.kube().list_all(
            SLICES_PATH, {"fieldSelector": f"spec.nodeName={node.name},spec.driver={DRIVER}"})
    except REQUEST_ERRORS:
        return 0
    return len(items)


def start_dra_plugin(node: RealNode, env: dict[str, str], say: Log, deadline: float) -> None:
    """Install the DeviceClasses, start the plugin and wait for its slices."""
    assert node.machine_file is not None
    install_device_classes(node.cluster.kube(), [node.machine_file], say, driver=DRIVER)
    t = time.monotonic()
    node._start("dra-plugin",
                [*node._numalign(), "dev", "dra-plugin", "--machine", str(node.machine_file),
                 "--kubelet-dir", str(node.kubelet_dir),
                 "--cdi-dir", str(node.containerd_dir / "cdi"), "--node", node.name],
                env=env, program="numalign")
    node._wait(f"the DRA plugin ({DRIVER}) to register and publish its ResourceSlices",
               lambda: published_slices(node) > 0, deadline, ("kubelet", "dra-plugin"))
    say(f"the DRA kubelet plugin {DRIVER} is registered and publishes the node's devices "
        f"({time.monotonic() - t:.1f}s)")
