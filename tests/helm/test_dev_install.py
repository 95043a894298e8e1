"""What ``numalign dev up --install kustomize|helm`` installs for the real node: the same
objects either way (the overlay of config/default and the chart's values render alike,
field for field), the dev image, the real node's own host paths for the agent (its sysfs
view, its kubelet's pod-resources folder and configuration, containerd's NRI socket
folder), the operator tolerating the node's taint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from test_chart import CHART, KUBE_VERSION, NAMESPACE, helm

from config_helpers import kustomize
from numalign.devcluster.cluster import DevCluster
from numalign.devcluster.install import (
    IMAGE,
    Installer,
    InstallError,
    helm_values,
    kustomization,
    merged,
)
from numalign.devcluster.realnode import RealNode
from numalign.devcluster.realnode_config import MODE_KUBELET, MODE_NRI, TAINT

Obj = dict[str, Any]


def _node(tmp_path: Path, mode: str) -> RealNode:
    return RealNode(DevCluster(tmp_path / "state"), mode=mode, host_agent=False)


def _both(tmp_path: Path, node: RealNode) -> tuple[list[Obj], list[Obj]]:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    doc = kustomization(node, overlay)
    doc["namespace"] = NAMESPACE
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(helm_values(node)))
    out = helm("template", "numalign", str(CHART), "--namespace", NAMESPACE,
               "--include-crds", "--kube-version", KUBE_VERSION, "--values", str(values)).stdout
    return kustomize(overlay), [d for d in yaml.safe_load_all(out) if d]


def _host_path(spec: Obj, path: str) -> str:
    """The host path the agent's container sees at ``path`` (through its mounts)."""
    [c] = spec["containers"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for m in sorted(c["volumeMounts"], key=lambda m: -len(m["mountPath"])):
        mount = m["mountPath"].rstrip("/")
        if path == mount or path.startswith(mount + "/"):
            host = volumes[m["name"]]["hostPath"]["path"]
            return host + path[len(mount):]
    raise AssertionError(f"nothing mounted at {path}")


@pytest.mark.parametrize("mode", [MODE_KUBELET, MODE_NRI])
def test_kustomize_and_helm_install_what_the_real_node_needs(tmp_path: Path,
                                                             mode: str) -> None:
    node = _node(tmp_path, mode)
    kustomized, templated = _both(tmp_path, node)
    # The same objects either way (the Namespace: helm installs into one that exists).
    assert {(o["kind"], o["metadata"]["name"]) for o in kustomized} - {
        ("Namespace", NAMESPACE)} == {(o["kind"], o["metadata"]["name"]) for o in templated}
    for objs in (kustomized, templated):
        by = {(o["kind"], o["metadata"]["name"]): o for o in objs}
        ds = by["DaemonSet", "numalign-agent"]["spec"]["template"]["spec"]
        sts = by["StatefulSet", "numalign-operator"]["spec"]["template"]["spec"]
        for spec in (ds, sts):
            [c] = spec["containers"]
            assert c["image"] == IMAGE
            assert c["resources"]["requests"]["cpu"] in ("0", 0)  # the node's CPU is free
        args = dict(a.split("=", 1) for a in ds["containers"][0]["args"] if "=" in a)
        assert _host_path(ds, args["--root"] + "/sys") == str(node.dir / "sys")
        assert _host_path(ds, args["--pod-resources"]) == str(node.pod_resources_socket)
        assert _host_path(ds, args["--kubelet-config"]) == str(node.kubelet_config)
        if mode == MODE_NRI:
            assert _host_path(ds, args["--nri-socket"]) == str(node.nri_socket)
        else:
            assert "--nri-socket" not in args
        assert {"key": TAINT["key"], "operator": "Equal", "value": TAINT["value"],
                "effect": TAINT["effect"]} in sts["tolerations"]


def test_extra_values_add_to_what_the_node_needs(tmp_path: Path) -> None:
    """Chart values beyond the node's (the second scheduler's e2e enables components)
    merge into the node's values key by key; kustomize takes none."""
    node = _node(tmp_path, MODE_KUBELET)
    base = helm_values(node)
    got = merged(base, {"operator": {"replicas": 1}, "scheduler": {"enabled": True}})
    assert got["operator"] == {**base["operator"], "replicas": 1}
    assert got["scheduler"] == {"enabled": True} and got["agent"] == base["agent"]
    assert base["operator"].get("replicas") is None, "the node's values are left as they were"
    with pytest.raises(InstallError, match="helm"):
        Installer(node.cluster, node, "kustomize", values={"scheduler": {"enabled": True}})
