"""kube-proxy on the real node, for a cluster whose pods reach Services (``dev up
--install``): built from the same Kubernetes module set as the kubelet
(:mod:`numalign.devcluster.nodebuild`), iptables mode, as the user ``system:kube-proxy``
(the API server's bootstrap role ``system:node-proxier``).

It gives the node what a cluster's network gives pods: the ``kubernetes`` Service
(10.96.0.1:443, the API server's pod-reachable address behind it) and every other
Service's cluster IP, from the pods (PREROUTING) and from this host (OUTPUT: the API
server calls webhook Services there). Every Service connection is masqueraded
(``masqueradeAll``): pods on the node's bridge then also reach Services backed by pods
on the same bridge without the bridge's netfilter hooks (br_netfilter). It touches no
sysctl (conntrack sizes left as they are, no localhost NodePorts) and listens on loopback
only. ``cleanup`` removes its rules (``kube-proxy --cleanup``) when the node goes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from . import certs
from .cluster import CLUSTER_CIDR, DevCluster, write_kubeconfig
from .nodebuild import node_bin_dir

USER = "system:kube-proxy"


def configuration(kubeconfig: Path, node: str, ports: dict[str, int]) -> dict[str, Any]:
    """The KubeProxyConfiguration: iptables mode, every Service connection masqueraded,
    health and metrics on loopback."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node,
        "mode": "iptables",
        "clusterCIDR": CLUSTER_CIDR,
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": f"127.0.0.1:{ports['kube-proxy-healthz']}",
        "metricsBindAddress": f"127.0.0.1:{ports['kube-proxy-metrics']}",
        "iptables": {"masqueradeAll": True, "localhostNodePorts": False},
        # 0: leave the host's conntrack table size and timeouts alone
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
    }


def write_files(cluster: DevCluster, node: str, directory: Path,
                ports: dict[str, int]) -> Path:
    """Its client certificate, kubeconfig and configuration in ``directory``; returns the
    configuration's path."""
    pair = certs.issue_client(cluster.pki, certs.KeyPair(directory / "kube-proxy.crt",
                                                         directory / "kube-proxy.key"), USER)
    kubeconfig = directory / "kube-proxy.kubeconfig"
    write_kubeconfig(kubeconfig, f"numalign-{cluster.name}", cluster.server or "",
                     cluster.pki.ca.cert, pair.cert, pair.key, USER)
    config = directory / "kube-proxy.yaml"
    config.write_text(yaml.safe_dump(configuration(kubeconfig, node, ports), sort_keys=False))
    return config


def argv(config: Path) -> list[str]:
    return [str(node_bin_dir() / "kube-proxy"), f"--config={config}", "--v=1"]


# What kube-proxy creates on start and ``--cleanup`` leaves (pkg/proxy/iptables: the
# kubelet's firewall chain, empty, with its jumps; the iptables mode hint): (table, chain,
# chains jumping to it). The kubelet itself makes none here (makeIPTablesUtilChains off).
_LEFT_BEHIND = (("filter", "KUBE-FIREWALL", ("INPUT", "OUTPUT")),
                ("mangle", "KUBE-IPTABLES-HINT", ()))


def _iptables(tool: str, *args: str) -> bool:
    return subprocess.run([tool, "-w", "5", *args], capture_output=True, timeout=30,
                          check=False).returncode == 0


def cleanup() -> str | None:
    """Remove the rules kube-proxy wrote (its chains and jumps, and what ``--cleanup``
    leaves of its start); the error, if any."""
    proc = subprocess.run([str(node_bin_dir() / "kube-proxy"), "--cleanup"],
                          capture_output=True, text=True, timeout=60, check=False)
    for tool in ("iptables", "ip6tables"):
        for table, chain, parents in _LEFT_BEHIND:
            # Only an empty chain (nobody else's rules in it) goes, with its jumps.
            listed = subprocess.run([tool, "-w", "5", "-t", table, "-S", chain],
                                    capture_output=True, text=True, timeout=30, check=False)
            if listed.returncode != 0 or f"-A {chain} " in listed.stdout:
                continue
            for parent in parents:
                while _iptables(tool, "-t", table, "-D", parent, "-j", chain):
                    pass
            _iptables(tool, "-t", table, "-X", chain)
    return None if proc.returncode == 0 else (proc.stderr or proc.stdout).strip()[-400:]
