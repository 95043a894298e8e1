"""The dev cluster's KubeSchedulerConfiguration: the client settings its deprecated flags
would have set, and numalign's extender (ignorable, node names only) unless left out."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from numalign.devcluster.cluster import client_qps_flags
from numalign.devcluster.scheduler import ExtenderTls, extender_entry, write_scheduler_config


def test_scheduler_config_with_and_without_the_extender(tmp_path: Path) -> None:
    kc = tmp_path / "scheduler.kubeconfig"
    path = write_scheduler_config(tmp_path, kc, client_qps_flags("200/400"),
                                  "http://127.0.0.1:4242")
    doc = yaml.safe_load(path.read_text())
    assert doc["kind"] == "KubeSchedulerConfiguration"
    assert doc["clientConnection"] == {"kubeconfig": str(kc), "qps": 200.0, "burst": 400}
    assert doc["leaderElection"] == {"leaderElect": False}
    [ext] = doc["extenders"]
    assert ext["urlPrefix"] == "http://127.0.0.1:4242"
    assert ext["filterVerb"] == "filter" and ext["prioritizeVerb"] == "prioritize"
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is True
    assert ext["enableHTTPS"] is False

    doc = yaml.safe_load(write_scheduler_config(tmp_path, kc, client_qps_flags("default"),
                                                None).read_text())
    assert "extenders" not in doc
    assert doc["clientConnection"] == {"kubeconfig": str(kc)}


def test_extender_over_https_carries_the_schedulers_tls_config(tmp_path: Path) -> None:
    tls = ExtenderTls(tmp_path / "ca.crt", tmp_path / "client.crt", tmp_path / "client.key")
    entry = extender_entry("https://127.0.0.1:4242", tls)
    assert entry["enableHTTPS"] is True
    assert entry["tlsConfig"] == {"caFile": str(tmp_path / "ca.crt"),
                                  "certFile": str(tmp_path / "client.crt"),
                                  "keyFile": str(tmp_path / "client.key")}
    assert "tlsConfig" not in extender_entry("https://127.0.0.1:4242")
    with pytest.raises(ValueError, match="https"):
        extender_entry("http://127.0.0.1:4242", tls)  # a client certificate in the clear
