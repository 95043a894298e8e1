"""Running ``numalign operator`` as a subprocess against the session's control plane."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OperatorProcess:
    def __init__(self, kubeconfig: Path, log: Path, *args: str,
                 env: dict[str, str] | None = None, fault: str | None = None) -> None:
        self.log = log
        # With a fault, the operator crashes at that redeploy checkpoint (fault_operator.py).
        self.entry = (["-m", "numalign.cli"] if fault is None
                      else [str(Path(__file__).with_name("fault_operator.py")), fault])
        self.args = args
        self.kubeconfig = kubeconfig
        # Unbuffered: tests read the log while the operator runs.
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        self._f = open(self.log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, *self.entry, "operator", "--kubeconfig",
             str(self.kubeconfig), "--metrics-port", "0", "--recreate-bare-pods", *self.args],
            stdout=self._f, stderr=subprocess.STDOUT, env=self.env, cwd=REPO)
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._f.close()
        return self.proc.returncode

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             interval: float = 0.25) -> Any:
    """Poll ``predicate`` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def webhooks_ready(api: client.ApiClient, port: int) -> bool:
    adm = client.AdmissionregistrationV1Api(api)
    try:
        mwc = adm.read_mutating_webhook_configuration("numalign.io")
        vwc = adm.read_validating_webhook_configuration("numalign.io")
    except ApiException:
        return False
    urls = [w.client_config.url or "" for w in (mwc.webhooks or []) + (vwc.webhooks or [])]
    return bool(urls) and all(f":{port}/" in u for u in urls)


def webhook_answers(api: client.ApiClient) -> bool:
    """A dry-run pod creation comes back resolved: the API server calls the webhook."""
    pod = client.CoreV1Api(api).create_namespaced_pod(
        "default", bare_pod(f"probe-{free_port()}"), dry_run="All")
    return "numalign.io/resolved" in (pod.metadata.annotations or {})


def delete_webhooks(api: client.ApiClient) -> None:
    adm = client.AdmissionregistrationV1Api(api)
    for fn in (adm.delete_mutating_webhook_configuration,
               adm.delete_validating_webhook_configuration):
        try:
            fn("numalign.io")
        except ApiException as e:
            if e.status != 404:
                raise


@contextmanager
def operator(kubeconfig: Path, api: client.ApiClient, log: Path, *args: str,
             webhooks: bool = True, env: dict[str, str] | None = None,
             fault: str | None = None) -> Iterator[OperatorProcess]:
    extra = list(args)
    port = free_port()
    if webhooks:
        extra += ["--webhook-port", str(port), "--cert-dir", str(log.parent / f"certs-{port}")]
    else:
        extra.append("--no-webhooks")
    op = OperatorProcess(kubeconfig, log, *extra, env=env, fault=fault).start()
    try:
        if webhooks:
            wait_for(lambda: webhooks_ready(api, port) or not op.alive(), 60,
                     "the operator's webhook configurations")
            wait_for(lambda: webhook_answers(api), 30, "the mutating webhook to answer")
        assert op.alive(), op.text()[-4000:]
        yield op
    finally:
        op.stop()
        if webhooks:
            delete_webhooks(api)


def resolved(core: client.CoreV1Api, ns: str, name: str) -> dict[str, Any] | None:
    try:
        pod = core.read_namespaced_pod(name, ns)
    except ApiException:
        return None
    text = (pod.metadata.annotations or {}).get("numalign.io/resolved")
    if not text:
        return None
    try:
        out: dict[str, Any] = json.loads(text)
    except ValueError:
        return None
    return out


def reject(core: client.CoreV1Api, ns: str, name: str, node: str | None = None) -> None:
    """Play the kubelet: bind (if asked) and mark the pod Failed / TopologyAffinityError."""
    if node is not None:
        core.create_namespaced_pod_binding(name, ns, {
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}},
            _preload_content=False)
    core.patch_namespaced_pod_status(name, ns, {"status": {
        "phase": "Failed", "reason": "TopologyAffinityError",
        "message": "Pod was rejected: Resources cannot be allocated with Topology locality"}})


def policy(api: client.ApiClient, name: str, spec: dict[str, Any], seen: bool = False,
           timeout: float = 60.0) -> None:
    """Create a TopologyPolicy; ``seen``: wait until the running operator has it (its
    status observed this generation: the operator writes it after reading the policy, so
    the webhook resolves pods created from then on under it)."""
    custom = client.CustomObjectsApi(api)
    made = custom.create_cluster_custom_object(
        "numalign.io", "v1alpha1", "topologypolicies",
        {"apiVersion": "numalign.io/v1alpha1", "kind": "TopologyPolicy",
         "metadata": {"name": name}, "spec": spec})
    if not seen:
        return
    generation = made["metadata"].get("generation", 1)

    def observed() -> bool:
        obj = custom.get_cluster_custom_object("numalign.io", "v1alpha1", "topologypolicies",
                                               name)
        return bool((obj.get("status") or {}).get("observedGeneration") == generation)

    wait_for(observed, timeout, f"the operator to see TopologyPolicy {name}")


def delete_policy(api: client.ApiClient, name: str) -> None:
    try:
        client.CustomObjectsApi(api).delete_cluster_custom_object(
            "numalign.io", "v1alpha1", "topologypolicies", name)
    except ApiException as e:
        if e.status != 404:
            raise


def bare_pod(name: str, labels: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}],
                            # Keep the real scheduler away: tests bind pods themselves.
                            "nodeSelector": {"numalign.io/test-never": "true"}}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
            "spec": spec}


def pods_named(core: client.CoreV1Api, ns: str) -> dict[str, Any]:
    return {p.metadata.name: p for p in core.list_namespaced_pod(ns).items}
