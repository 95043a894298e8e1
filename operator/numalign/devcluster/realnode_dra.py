"""The real node's devices through DRA (``numalign dev up --real-node --dra``): the
DeviceClasses of the real node's driver, the command line of its kubelet plugin
(:mod:`numalign.devcluster.draplugin`, ``numalign dev dra-plugin``) started beside the
kubelet, and whether its ResourceSlices are published (it publishes them once the kubelet
has registered it)."""

from __future__ import annotations

from pathlib import Path

from ..api.kube import REQUEST_ERRORS, SyncKube
from .cluster import Log
from .dra import install_device_classes
from .draplugin import DRIVER, SLICES_PATH


def install_classes(kube: SyncKube, machine_file: Path, say: Log) -> list[str]:
    """The DeviceClasses of the real node's driver for its machine file's device kinds."""
    return install_device_classes(kube, [machine_file], say, driver=DRIVER)


def plugin_argv(numalign: list[str], machine_file: Path, kubelet_dir: Path, cdi_dir: Path,
                node: str) -> list[str]:
    """``numalign dev dra-plugin`` for the node."""
    return [*numalign, "dev", "dra-plugin", "--machine", str(machine_file),
            "--kubelet-dir", str(kubelet_dir), "--cdi-dir", str(cdi_dir), "--node", node]


def published_slices(kube: SyncKube, node: str) -> int:
    """How many ResourceSlices of the real node's driver ``node`` has."""
    try:
        items, _ = kube.list_all(
            SLICES_PATH, {"fieldSelector": f"spec.nodeName={node},spec.driver={DRIVER}"})
    except REQUEST_ERRORS:
        return 0
    return len(items)
