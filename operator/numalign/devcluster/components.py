"""The command lines of the dev control plane's processes, on loopback:

* etcd serves HTTPS only (a serving certificate of the etcd CA) and answers only clients
  with a certificate that CA signed (``--client-cert-auth``): the API server's, and the
  dev cluster's health probe, which uses the same one. Its peer port (one member, no
  peers) is TLS with peer certificates required too: it serves raft and the membership
  endpoints, which no local user may reach;
* kube-apiserver reaches etcd with its etcd client certificate (``--etcd-certfile``);
* kube-controller-manager and kube-scheduler, each with its kubeconfig.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ..api.kube import KubeConfig, SyncKube
from .certs import Pki


def etcd_url(port: int) -> str:
    return f"https://127.0.0.1:{port}"


def etcd_client(pki: Pki, port: int) -> SyncKube:
    """A client of etcd's HTTP endpoints (``/health``, ``/metrics``) with the one client
    certificate etcd answers: the API server's."""
    return SyncKube(KubeConfig.from_files(etcd_url(port), pki.etcd_ca,
                                          pki.apiserver_etcd_client.cert,
                                          pki.apiserver_etcd_client.key),
                    max_connections=1, user_agent="numalign-dev")


def etcd_args(bins: Path, pki: Pki, data_dir: Path, port: int, peer_port: int) -> list[str]:
    client, peer = etcd_url(port), etcd_url(peer_port)
    return [
        str(bins / "etcd"),
        "--name=dev",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--cert-file={pki.etcd_server.cert}",
        f"--key-file={pki.etcd_server.key}",
        "--client-cert-auth=true",
        f"--trusted-ca-file={pki.etcd_ca}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=dev={peer}",
        f"--peer-cert-file={pki.etcd_peer.cert}",
        f"--peer-key-file={pki.etcd_peer.key}",
        "--peer-client-cert-auth=true",
        f"--peer-trusted-ca-file={pki.etcd_ca}",
        "--unsafe-no-fsync",  # a throwaway dev store: no fsync, much faster on slow disks
        "--log-level=warn",
    ]


def apiserver_args(bins: Path, pki: Pki, port: int, etcd: str, service_cidr: str,
                   address: str | None = None) -> list[str]:
    p = pki
    return [
        str(bins / "kube-apiserver"),
        f"--etcd-servers={etcd}",
        f"--etcd-cafile={p.etcd_ca}",
        f"--etcd-certfile={p.apiserver_etcd_client.cert}",
        f"--etcd-keyfile={p.apiserver_etcd_client.key}",
        f"--bind-address={address or '127.0.0.1'}",
        f"--advertise-address={address or '127.0.0.1'}",
        f"--secure-port={port}",
        f"--cert-dir={p.dir}",
        f"--tls-cert-file={p.apiserver.cert}",
        f"--tls-private-key-file={p.apiserver.key}",
        f"--client-ca-file={p.ca.cert}",
        "--authorization-mode=Node,RBAC",  # Node: a real kubelet's own rights
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={p.sa_pub}",
        f"--service-account-signing-key-file={p.sa_key}",
        f"--service-cluster-ip-range={service_cidr}",
        f"--requestheader-client-ca-file={p.front_proxy_ca.cert}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={p.front_proxy_client.cert}",
        f"--proxy-client-key-file={p.front_proxy_client.key}",
        # A real node (realnode.py) is reached by its Hostname address (localhost).
        f"--kubelet-client-certificate={p.apiserver_kubelet_client.cert}",
        f"--kubelet-client-key={p.apiserver_kubelet_client.key}",
        "--kubelet-preferred-address-types=Hostname,InternalIP",
        "--allow-privileged=true",
        # DRA devices' list attributes (resource.kubernetes.io/numaNode as a list of equally
        # close NUMA nodes, KEP-6072): alpha in 1.37, off by default.
        "--feature-gates=DRAListTypeAttributes=true",
        # The kubernetes Service's endpoint: the pod-reachable address (the default
        # reconciler), none on loopback (no valid endpoint address).
        *(() if address else ("--endpoint-reconciler-type=none",)),
        "--profiling=false",
        "--v=1",
    ]


def _component_args(binary: Path, kubeconfig: Path, port: int, cert_dir: Path) -> list[str]:
    """What kube-controller-manager and kube-scheduler share: one kubeconfig for
    everything, a loopback secure port, no leader election."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        "--leader-elect=false",
    ]


def controller_manager_args(bins: Path, pki: Pki, kubeconfig: Path, port: int, cert_dir: Path,
                            *, controllers: Iterable[str], service_cidr: str,
                            cluster_cidr: str, qps_flags: tuple[str, ...]) -> list[str]:
    p = pki
    return [
        *_component_args(bins / "kube-controller-manager", kubeconfig, port, cert_dir),
        "--controllers=" + ",".join(controllers),
        f"--service-account-private-key-file={p.sa_key}",
        f"--root-ca-file={p.ca.cert}",
        "--use-service-account-credentials=true",
        f"--cluster-signing-cert-file={p.ca.cert}",
        f"--cluster-signing-key-file={p.ca.key}",
        f"--service-cluster-ip-range={service_cidr}",
        f"--cluster-cidr={cluster_cidr}",
        "--allocate-node-cidrs=false",
        *qps_flags,
        "--profiling=false",
        "--v=1",
    ]


def scheduler_args(bins: Path, kubeconfig: Path, port: int, cert_dir: Path,
                   config: Path) -> list[str]:
    return [
        *_component_args(bins / "kube-scheduler", kubeconfig, port, cert_dir),
        f"--config={config}",
        "--v=1",
    ]
