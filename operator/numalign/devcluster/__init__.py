"""A local Kubernetes control plane built from source, for the tests and the demo.

``build.ensure_built()`` compiles (once, cached) etcd, kube-apiserver,
kube-controller-manager and kube-scheduler; ``DevCluster(state_dir).up()`` starts them
on loopback with generated certificates and installs the numalign CRDs; ``.down()``
stops everything. ``numalign dev up|down|kubeconfig|build`` is the command-line face.
"""

from .addons import ADDONS, Addon, ClusterInfo, MachineSpec, MachineSpecError
from .build import BuildError, ensure_built, is_built
from .cluster import DevCluster, DevClusterError, default_state_dir
from .crds import CrdError
from .realnode import RealNode  # also registers its teardown with the cluster (on_down)

__all__ = [
    "ADDONS",
    "Addon",
    "BuildError",
    "ClusterInfo",
    "CrdError",
    "DevCluster",
    "DevClusterError",
    "MachineSpec",
    "MachineSpecError",
    "RealNode",
    "default_state_dir",
    "ensure_built",
    "is_built",
]
