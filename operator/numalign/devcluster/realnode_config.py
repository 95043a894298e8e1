"""The real node's configuration files, as data: containerd's (config version 3, with the
CRI runtime, CNI and NRI), its CNI network, and the KubeletConfiguration.

The node runs in one of two modes (:data:`MODES`): ``kubelet`` (the kubelet's static CPU
manager and Topology Manager place containers) or ``nri`` (numalign-managed: the kubelet's
CPU, memory and Topology managers are ``none``, the Node carries the label
``numalign.io/managed=nri`` and numalign's agent places each container through containerd's
NRI socket)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from numalign.api.names import ANN_TOLERATE_UNPLACED, LABEL_MANAGED, MANAGED_NRI

from .images import PAUSE_IMAGE
from .nodebuild import cni_bin_dir, node_bin_dir

POD_SUBNET = "10.244.0.0/24"
# Pods land on the real node only when they tolerate this (and select it): the cluster's
# other pods (tests, samples) use images it does not have.
TAINT = {"key": "numalign.io/real-node", "value": "true", "effect": "NoSchedule"}
MODE_KUBELET = "kubelet"  # the kubelet's managers place containers
MODE_NRI = "nri"  # numalign's agent places them, through NRI
MODES = (MODE_KUBELET, MODE_NRI)
CONTAINERD_DIRS = ("root", "state", "cni/conf", "cni/ipam", "runc", "cdi", "nri/plugins",
                   "nri/conf", "opt")


def cni_conflist(bridge: str, ipam_dir: Path, gateway: bool = False) -> dict[str, Any]:
    """One bridge network, no masquerading (no iptables needed); with ``gateway`` the
    bridge holds the subnet's first address and is the pods' default route (to this host:
    the API server, and Services through kube-proxy), else pods reach only each other."""
    return {
        "cniVersion": "1.0.0",
        "name": "numalign",
        "plugins": [
            {"type": "bridge", "bridge": bridge, "isGateway": gateway,
             "isDefaultGateway": gateway, "ipMasq": False,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                      "dataDir": str(ipam_dir)}},
        ],
    }


def containerd_config(d: Path, socket: Path, nri_socket: Path,
                      required_plugin: str | None = None) -> str:
    """containerd's config.toml for the state folder ``d``, serving CRI on ``socket`` and
    NRI (plugins register there) on ``nri_socket``. With ``required_plugin`` NRI's default
    validator fails every container's creation while that plugin is not registered (unless
    its pod carries ``numalign.io/tolerate-unplaced: "true"``), so that no container starts
    unplaced while the agent is away; the kubelet retries it."""
    q = json.dumps  # TOML basic strings are JSON strings
    validator = "" if required_plugin is None else f"""\
    # the agent's plugin decides within this (its write of the pod's record included)
    plugin_request_timeout = '10s'
    [plugins.'io.containerd.nri.v1.nri'.default_validator]
      enable = true
      required_plugins = [{q(required_plugin)}]
      tolerate_missing_plugins_annotation = {q(ANN_TOLERATE_UNPLACED)}
"""
    rt = "plugins.'io.containerd.cri.v1.runtime'"
    return f"""version = 3
root = {q(str(d / 'root'))}
state = {q(str(d / 'state'))}

[grpc]
  address = {q(str(socket))}

[ttrpc]
  address = {q(str(d / 'containerd.sock.ttrpc'))}

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = {q(str(d / 'opt'))}

  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = {q(PAUSE_IMAGE)}

  [{rt}]
    enable_selinux = false
    # root here may lack CAP_SYS_RESOURCE: the sandbox's oom_score_adj of -998 is refused
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    cdi_spec_dirs = [{q(str(d / 'cdi'))}]
    [{rt}.containerd]
      default_runtime_name = 'runc'
      [{rt}.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [{rt}.containerd.runtimes.runc.options]
          BinaryName = {q(str(node_bin_dir() / 'runc'))}
          Root = {q(str(d / 'runc'))}
          SystemdCgroup = false
    [{rt}.cni]
      bin_dirs = [{q(str(cni_bin_dir()))}]
      conf_dir = {q(str(d / 'cni/conf'))}

  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'

  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    socket_path = {q(str(nri_socket))}
    plugin_path = {q(str(d / 'nri/plugins'))}
    plugin_config_path = {q(str(d / 'nri/conf'))}
{validator}"""


def node_labels(mode: str) -> dict[str, str]:
    """The labels the kubelet registers the Node with in ``mode``."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
    return {LABEL_MANAGED: MANAGED_NRI} if mode == MODE_NRI else {}


def managers(mode: str, policy: str, scope: str) -> dict[str, str]:
    """The kubelet's resource managers in ``mode``: the static CPU manager and the Topology
    Manager with ``policy`` and ``scope`` (kubelet), or all of them ``none`` (nri)."""
    if mode == MODE_NRI:
        return {"cpuManagerPolicy": "none", "memoryManagerPolicy": "None",
                "topologyManagerPolicy": "none", "topologyManagerScope": "container"}
    if mode == MODE_KUBELET:
        return {"cpuManagerPolicy": "static", "topologyManagerPolicy": policy,
                "topologyManagerScope": scope}
    raise ValueError(f"mode {mode!r}: expected one of {', '.join(MODES)}")


def kubelet_configuration(*, ports: dict[str, int], policy: str, scope: str, reserved: str,
                          cgroup_root: str, ca_cert: Path, endpoint: str,
                          pod_logs: Path, mode: str = MODE_KUBELET) -> dict[str, Any]:
    """The KubeletConfiguration: loopback only, the resource managers of ``mode`` (see
    :func:`managers`), one reserved CPU, cgroup v1 allowed, the node tainted."""
    m = managers(mode, policy, scope)
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": ports["kubelet"],
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports["healthz"],
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(ca_cert)}},
        "authorization": {"mode": "AlwaysAllow"},  # loopback only; clients need the CA
        "containerRuntimeEndpoint": endpoint,
        "imageServiceEndpoint": endpoint,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "failCgroupV1": False,  # this kind of machine mounts cgroup v1
        "failSwapOn": False,
        "cpuManagerPolicy": m["cpuManagerPolicy"],
        # Reserved in both modes: the kubelet keeps it out of allocatable, numalign's
        # agent (nri) never gives it exclusively (it reads this file).
        "reservedSystemCPUs": reserved,
        "cpuManagerReconcilePeriod": "5s",
        **({"memoryManagerPolicy": m["memoryManagerPolicy"]}
           if "memoryManagerPolicy" in m else {}),
        "topologyManagerPolicy": m["topologyManagerPolicy"],
        "topologyManagerScope": m["topologyManagerScope"],
        "podLogsDirectory": str(pod_logs),
        "imageGCHighThresholdPercent": 100,  # the imported images cannot be pulled again
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "serializeImagePulls": False,
        "clusterDomain": "cluster.local",
        "resolvConf": "",
        "registerNode": True,
        "registerWithTaints": [TAINT],
        "staticPodPath": "",
        # No iptables chains of the kubelet's own (KUBE-FIREWALL, canaries) on this host;
        # kube-proxy (dev up --install) writes and removes the Service rules.
        "makeIPTablesUtilChains": False,
        "nodeStatusReportFrequency": "10s",
        "shutdownGracePeriod": "0s",
    }
