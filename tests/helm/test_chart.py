"""The Helm chart (charts/numalign) installs what config/ installs: ``helm template`` with
the defaults (and the placeholder addresses config/ ships for the API server's and
kube-scheduler's sources, which the chart leaves empty: nobody admitted) renders every
object of ``kubectl kustomize config/default``, field for field
(images, args, ports, probes, securityContext, volumes, RBAC rules, webhooks, admission
policies: the whole object but the labels Helm adds); each optional component's values
block renders what config/default with that kustomize component renders. Any object added
to config/ fails this test until the chart has it too. ``helm lint --strict`` passes, the
values schema refuses unknown and ill-typed values, and the chart follows its release
namespace where config/ hard-codes numalign-system. Beyond config/: the Grafana dashboard's
ConfigMap carries config/grafana's dashboard, the install notes config/extender's
KubeSchedulerConfiguration entry, empty source lists render NetworkPolicies that admit
nobody to those ports, and the TLS the chart generates for the extender lets the
scheduler's client certificate, and only it, through a mutual-TLS handshake.

helm is built by ``numalign dev build`` (numalign.devcluster.helmbuild), or by this
suite's conftest before its first test."""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from config_helpers import CONFIG, REPO, kustomize
from numalign.devcluster.helmbuild import helm_path

CHART = REPO / "charts" / "numalign"
NAMESPACE = "numalign-system"
KUBE_VERSION = "v1.37.2"
Obj = dict[str, Any]
# Objects that exist in a namespace; every other kind config/ renders is cluster-scoped
# (kustomize still gives some of them a namespace: config/README.md, Notes).
NAMESPACED = {"ServiceAccount", "Role", "RoleBinding", "Service", "StatefulSet", "DaemonSet",
              "PodDisruptionBudget", "NetworkPolicy", "ServiceMonitor", "PodMonitor",
              "PrometheusRule", "ConfigMap", "Secret", "Deployment"}
# config/default creates its namespace; a Helm release lives in one that exists already
# (helm install --create-namespace): README "Install with Helm" says how to label it.
NOT_IN_CHART = {("Namespace", NAMESPACE)}
# config/ ships a placeholder CIDR (TEST-NET-1: admits nobody) where the user lists the
# API server's (and kube-scheduler's) addresses; the chart's values are empty lists.
PLACEHOLDER = "192.0.2.0/24"
PLACEHOLDERS = [f"operator.apiServerSources={{{PLACEHOLDER}}}"]
# The kustomize components of config/ and the chart's values that enable the same thing,
# in the order the chart appends their arguments and volumes.
COMPONENTS = {
    "extender": ["extender.enabled=true", f"extender.schedulerSources={{{PLACEHOLDER}}}"],
    "kubelet-resources": ["kubeletResources.enabled=true"],
    "nri": ["nri.enabled=true"],
    "nrt": ["nrt.enabled=true"],
    "prometheus": ["prometheus.serviceMonitor.enabled=true",
                   "prometheus.podMonitor.enabled=true", "prometheus.rules.enabled=true"],
    "recreate-bare-pods": ["recreateBarePods.enabled=true"],
    # config/scheduler includes config/extender
    "scheduler": ["extender.enabled=true", f"extender.schedulerSources={{{PLACEHOLDER}}}",
                  "scheduler.enabled=true"],
}
# Every component at once: config/scheduler stands for config/extender (it includes it).
ALL = [c for c in COMPONENTS if c != "extender"]

def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(helm_path()), *args], capture_output=True, text=True,
                          timeout=120, check=False)
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stderr}"
    return proc


def template(*sets: str, namespace: str = NAMESPACE) -> list[Obj]:
    flags = [f for s in sets for f in ("--set", s)]
    out = helm("template", "numalign", str(CHART), "--namespace", namespace,
               "--include-crds", "--kube-version", KUBE_VERSION, *flags).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _key(obj: Obj) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def _folded(value: Any) -> Any:
    """Multi-line strings (CEL expressions) with their whitespace runs as one space:
    kustomize re-emits a folded scalar's more-indented lines with an extra line break."""
    if isinstance(value, dict):
        return {k: _folded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_folded(v) for v in value]
    if isinstance(value, str) and "\n" in value:
        return " ".join(value.split())
    return value


def _normalized(obj: Obj) -> Obj:
    """The object without the labels, Helm's annotations (helm.sh/resource-policy) and,
    for a cluster-scoped kind, its namespace."""
    meta = {k: v for k, v in obj["metadata"].items() if k != "labels"}
    notes = {k: v for k, v in (meta.pop("annotations", None) or {}).items()
             if not k.startswith("helm.sh/")}
    if notes:
        meta["annotations"] = notes
    if obj["kind"] not in NAMESPACED:
        meta.pop("namespace", None)
    spec = obj.get("spec")
    template = spec.get("template") if isinstance(spec, dict) else None
    if isinstance(template, dict) and (template.get("metadata") or {}).get("annotations"):
        # Helm rolls a workload whose ConfigMap changed by a checksum/ annotation on its
        # pods (kustomize users restart it); the rest of the pod template must match
        tmeta = dict(template["metadata"])
        kept = {k: v for k, v in tmeta.pop("annotations").items()
                if not k.startswith("checksum/")}
        if kept:
            tmeta["annotations"] = kept
        spec = {**spec, "template": {**template, "metadata": tmeta}}
        obj = {**obj, "spec": spec}
    return dict(_folded({**obj, "metadata": meta}))


def assert_chart_renders(expected: list[Obj], chart: list[Obj]) -> None:
    ours = {_key(o): o for o in chart}
    assert len(ours) == len(chart), "the chart renders an object twice"
    theirs = {_key(o): o for o in expected if _key(o) not in NOT_IN_CHART}
    missing = sorted(set(theirs) - set(ours))
    assert not missing, f"config/ renders objects the chart lacks: {missing}"
    extra = sorted(set(ours) - set(theirs))
    assert not extra, f"the chart renders objects config/ does not: {extra}"
    for key, want in theirs.items():
        got = ours[key]
        assert _normalized(got) == _normalized(want), f"{key[0]}/{key[1]} differs"
        labels = got["metadata"].get("labels") or {}
        if got["kind"] != "CustomResourceDefinition":  # crds/ files are not templated
            missing_labels = {k: v for k, v in (want["metadata"].get("labels") or {}).items()
                              if labels.get(k) != v}
            assert not missing_labels, f"{key[0]}/{key[1]} lacks labels {missing_labels}"


def overlay(tmp_path: Path, components: list[str]) -> list[Obj]:
    """config/default with the components, their own objects in its namespace and with
    its image (config/default's transformers do not reach a component's objects)."""
    default = yaml.safe_load((CONFIG / "default" / "kustomization.yaml").read_text())
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": NAMESPACE, "images": default["images"],
        "resources": [os.path.relpath(CONFIG / "default", tmp_path)],
        "components": [os.path.relpath(CONFIG / c, tmp_path) for c in components]}))
    return kustomize(tmp_path)


def test_helm_lint_strict() -> None:
    helm("lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART))
    every = [f for sets in [*COMPONENTS.values(), ["grafana.dashboard.enabled=true"]]
             for s in sets for f in ("--set", s)]
    helm("lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART), *every)


def test_defaults_render_config_default() -> None:
    assert_chart_renders(kustomize(CONFIG / "default"), template(*PLACEHOLDERS))


@pytest.mark.parametrize("components", [
    ["extender"], ["kubelet-resources"], ["kubelet-resources", "nri"], ["nri"], ["nrt"],
    ["prometheus"], ["recreate-bare-pods"], ["scheduler"], ALL], ids="+".join)
def test_values_render_each_component(components: list[str], tmp_path: Path) -> None:
    sets = [s for c in components for s in COMPONENTS[c]]
    assert_chart_renders(overlay(tmp_path, components), template(*PLACEHOLDERS, *sets))


def test_chart_follows_its_release_namespace() -> None:
    every = [s for sets in COMPONENTS.values() for s in sets]
    objs = {_key(o): o for o in template(*every, namespace="numalign")}
    for (kind, name), obj in objs.items():
        if kind in NAMESPACED:
            assert obj["metadata"]["namespace"] == "numalign", f"{kind}/{name}"
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in objs[kind, "numalign.io"]["webhooks"]:
            assert hook["clientConfig"]["service"]["namespace"] == "numalign"
            [expr] = hook["namespaceSelector"]["matchExpressions"]
            assert expr["values"] == ["kube-system", "numalign"]
    for (kind, name), obj in objs.items():
        if kind in ("ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicyBinding"):
            assert obj["spec"]["paramRef"]["namespace"] == "numalign", name
        if kind.endswith("RoleBinding"):
            assert {s["namespace"] for s in obj["subjects"]} == {"numalign"}, name


def test_values_reach_the_workloads() -> None:
    objs = {_key(o): o for o in template(
        "image.repository=registry.example/numalign", "image.tag=1.2.3",
        "operator.replicas=3", "operator.extraArgs={--verbose}",
        "agent.nodeSelector.pool=gpu")}
    sts, ds = objs["StatefulSet", "numalign-operator"], objs["DaemonSet", "numalign-agent"]
    for workload in (sts, ds):
        [c] = workload["spec"]["template"]["spec"]["containers"]
        assert c["image"] == "registry.example/numalign:1.2.3"
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "--verbose"
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux",
                                                              "pool": "gpu"}


@pytest.mark.parametrize(("value", "complaint"), [
    ("operator.replica=3", "replica"),              # a typo: not a property
    ("operator.replicas=0", "minimum"),
    ("webhooks.failurePolicy=Sometimes", "failurePolicy"),
    ("nri.socketDir=var/run/nri", "socketDir"),      # not an absolute path
    ("kubeletResources.enabled=yes", "enabled"),
    ("agent.ports.metrics=70000", "metrics"),
    ("extender.replicas=2", "replicas"),            # one replica only: not a value
    ("grafana.dashboard.namespace=Monitoring", "namespace"),
    ("extender.schedulerSources={10.0.0.10}", "schedulerSources"),  # no prefix length
    ("operator.apiServerSources={control-plane}", "apiServerSources"),
    ("extender.tls.secretName=Extender_TLS", "secretName"),
    ("extender.tls.days=0", "days"),
    ("extender.tls.generated=true", "generated"),  # a typo: not a property
    ("extender.probePort=0", "probePort"),
    ("extender.networkPolicy.probesFrom[0].ipBlock.cidr=0.0.0.0/0", "ipBlock"),
    ("scheduler.extenderURL=http://10.0.0.1:8890", "extenderURL"),  # the verbs are HTTPS
    ("scheduler.replicas=0", "minimum"),
    ("scheduler.networkPolicy.metricsFrom[0].ipBlock.cidr=0.0.0.0/0", "ipBlock"),
    ("scheduler.name=other", "name"),  # the profile is numalign-scheduler: not a value
])
def test_schema_refuses_bad_values(value: str, complaint: str) -> None:
    proc = helm("template", "numalign", str(CHART), "--kube-version", KUBE_VERSION,
                "--set", value, check=False)
    assert proc.returncode != 0, f"{value} was accepted"
    assert complaint in proc.stderr, proc.stderr


def test_grafana_dashboard_configmap() -> None:
    """Off by default; enabled, config/grafana's dashboard as it is, in a ConfigMap with
    the label Grafana's sidecar watches for, in the namespace given."""
    assert not [o for o in template() if o["kind"] == "ConfigMap"
                and o["metadata"]["name"] == "numalign-dashboard"]
    objs = {_key(o): o for o in template("grafana.dashboard.enabled=true",
                                         "grafana.dashboard.namespace=monitoring",
                                         "grafana.dashboard.annotations.grafana_folder=numa")}
    cm = objs["ConfigMap", "numalign-dashboard"]
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "numa"}
    [(name, text)] = cm["data"].items()
    assert name.endswith(".json")
    dashboard = (CONFIG / "grafana" / "numalign-dashboard.json").read_text()
    assert json.loads(text) == json.loads(dashboard)


def test_notes_give_the_extenders_entry() -> None:
    """With the extender, the install notes print config/extender/scheduler-config.yaml's
    entry for kube-scheduler's configuration, on the extender's port."""
    def entry(*sets: str) -> Obj:
        flags = [f for s in ("extender.enabled=true", *sets) for f in ("--set", s)]
        out = helm("install", "numalign", str(CHART), "--dry-run=client", "--namespace",
                   NAMESPACE, *flags).stdout
        notes = out.split("\nNOTES:\n", 1)[1]
        block = notes[notes.index("  extenders:"):].split("\n\n", 1)[0]
        [one] = yaml.safe_load(textwrap.dedent(block))["extenders"]
        return dict(one)

    fragment = yaml.safe_load((CONFIG / "extender" / "scheduler-config.yaml").read_text())
    assert entry() == fragment["extenders"][0]
    assert entry("extender.port=9999")["urlPrefix"].endswith(":9999")
    # The generated serving certificate names the Service, not its ClusterIP.
    generated = entry("extender.tls.generate=true")
    assert generated["tlsConfig"] == {**fragment["extenders"][0]["tlsConfig"],
                                      "serverName": "numalign-extender.numalign-system.svc"}


def _ingress(objs: list[Obj], name: str) -> dict[str, Any]:
    [policy] = [o for o in objs if _key(o) == ("NetworkPolicy", name)]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    return {p["port"]: rule.get("from") for rule in policy["spec"].get("ingress") or []
            for p in rule["ports"]}


def test_empty_sources_admit_nobody_to_the_webhooks_and_the_verbs() -> None:
    """The chart's defaults fail closed: with no addresses given, the NetworkPolicies
    have no rule for the webhook and verbs ports at all (a rule without `from` would
    admit every source); the addresses given become the only ipBlocks."""
    objs = template("extender.enabled=true")
    assert _ingress(objs, "numalign-operator").keys() == {"metrics"}
    assert _ingress(objs, "numalign-extender").keys() == {"probes"}
    objs = template("extender.enabled=true", "extender.networkPolicy.probesFrom=null",
                    "operator.apiServerSources={10.0.0.10/32,fd00::10/128}",
                    "extender.schedulerSources={10.0.0.11/32}")
    assert _ingress(objs, "numalign-operator")["webhook"] == [
        {"ipBlock": {"cidr": "10.0.0.10/32"}}, {"ipBlock": {"cidr": "fd00::10/128"}}]
    assert _ingress(objs, "numalign-extender") == {
        "https": [{"ipBlock": {"cidr": "10.0.0.11/32"}}]}
    objs = template("extender.enabled=true",
                    "extender.networkPolicy.probesFrom[0].podSelector.matchLabels.app=prom")
    assert _ingress(objs, "numalign-extender")["probes"] == [
        {"podSelector": {"matchLabels": {"app": "prom"}}}]


def _data(secret: Obj) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def _handshake(server: dict[str, bytes], client: dict[str, bytes] | None,
               server_name: str, tmp_path: Path) -> str | None:
    """A TLS handshake between a server with the extender's Secret (serving certificate,
    client certificates verified against its ca.crt, as --client-ca does) and a client
    with kube-scheduler's files (or none); the failure, or None."""
    tmp_path.mkdir(parents=True)
    for name, data in {**{f"s-{k}": v for k, v in server.items()},
                       **{f"c-{k}": v for k, v in (client or {}).items()}}.items():
        (tmp_path / name).write_bytes(data)
    srv = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    srv.load_cert_chain(tmp_path / "s-tls.crt", tmp_path / "s-tls.key")
    srv.load_verify_locations(tmp_path / "s-ca.crt")
    srv.verify_mode = ssl.CERT_REQUIRED
    cli = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    cli.load_verify_locations(tmp_path / "c-ca.crt" if client else tmp_path / "s-ca.crt")
    if client:
        cli.load_cert_chain(tmp_path / "c-scheduler.crt", tmp_path / "c-scheduler.key")
    listener = socket.create_server(("127.0.0.1", 0))
    errors: list[str] = []

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with srv.wrap_socket(conn, server_side=True) as s:
                s.recv(1)
        except (ssl.SSLError, OSError) as e:
            errors.append(f"server: {e}")

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with socket.create_connection(listener.getsockname(), timeout=10) as raw, \
                cli.wrap_socket(raw, server_hostname=server_name) as s:
            s.sendall(b"x")
            s.recv(1)  # TLS 1.3: the server's verdict on the client certificate
    except (ssl.SSLError, OSError) as e:
        errors.append(f"client: {e}")
    thread.join(10)
    listener.close()
    return "; ".join(errors) or None


def test_generated_tls_authenticates_the_scheduler_and_only_it(tmp_path: Path) -> None:
    """extender.tls.generate: the extender's Secret (tls.crt, tls.key, ca.crt) and the
    scheduler's (ca.crt, scheduler.crt, scheduler.key) complete a mutual-TLS handshake
    for the name the install notes give as tlsConfig.serverName; a client without a
    certificate is refused. The Deployment mounts the Secret it names."""
    objs = {_key(o): o for o in template("extender.enabled=true",
                                         "extender.tls.generate=true", namespace="numa")}
    server = objs["Secret", "numalign-extender-tls"]
    client = objs["Secret", "numalign-extender-scheduler"]
    assert server["type"] == "kubernetes.io/tls"
    assert set(server["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert set(client["data"]) == {"ca.crt", "scheduler.crt", "scheduler.key"}
    s, c = _data(server), _data(client)
    cert = x509.load_pem_x509_certificate(s["tls.crt"])
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "numalign-extender.numa.svc" in names.get_values_for_type(x509.DNSName)
    assert _handshake(s, c, "numalign-extender.numa.svc", tmp_path / "ok") is None
    refused = _handshake(s, None, "numalign-extender.numa.svc", tmp_path / "none")
    assert refused is not None and "certificate" in refused.lower(), refused
    [dep] = [o for k, o in objs.items() if k == ("Deployment", "numalign-extender")]
    [vol] = [v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
    assert vol["secret"]["secretName"] == "numalign-extender-tls"
    # Not generated: the chart renders no Secret (the user's, from numalign extender-certs).
    assert not [o for o in template("extender.enabled=true") if o["kind"] == "Secret"]


def _scheduler(*sets: str, namespace: str = NAMESPACE) -> tuple[Obj, Obj]:
    """The second scheduler's Deployment and its KubeSchedulerConfiguration."""
    objs = {_key(o): o for o in template("extender.enabled=true", "scheduler.enabled=true",
                                         *sets, namespace=namespace)}
    config = yaml.safe_load(objs["ConfigMap", "numalign-scheduler-config"]["data"]["config.yaml"])
    return objs["Deployment", "numalign-scheduler"], config


def test_second_scheduler_follows_its_values() -> None:
    """scheduler.enabled needs the extender; its configuration follows the release
    namespace (the Lease, the extender's name) and scheduler.extenderURL, and a changed
    configuration rolls the Deployment (helm upgrade restarts the scheduler)."""
    proc = helm("template", "numalign", str(CHART), "--kube-version", KUBE_VERSION,
                "--set", "scheduler.enabled=true", check=False)
    assert proc.returncode != 0 and "extender.enabled=true" in proc.stderr
    assert not [o for o in template("extender.enabled=true") if "scheduler" in _key(o)[1]]

    _, config = _scheduler(namespace="numa")
    assert config["profiles"] == [{"schedulerName": "numalign-scheduler"}]
    assert config["leaderElection"]["resourceNamespace"] == "numa"
    [entry] = config["extenders"]
    assert entry["urlPrefix"] == "https://numalign-extender.numa.svc:8890"
    assert entry["tlsConfig"]["serverName"] == "numalign-extender.numa.svc"
    moved, moved_config = _scheduler("scheduler.extenderURL=https://10.96.0.20:8890",
                                     "scheduler.replicas=2", "scheduler.securePort=10300")
    [entry] = moved_config["extenders"]
    assert entry["urlPrefix"] == "https://10.96.0.20:8890"
    # the certificate names the Service whatever the address
    assert entry["tlsConfig"]["serverName"] == "numalign-extender.numalign-system.svc"
    assert moved["spec"]["replicas"] == 2
    [c] = moved["spec"]["template"]["spec"]["containers"]
    assert "--secure-port=10300" in c["command"] and c["ports"][0]["containerPort"] == 10300
    _, same_config = _scheduler()
    assert same_config != moved_config

    def checksum(d: Obj) -> str:
        return str(d["spec"]["template"]["metadata"]["annotations"]["checksum/scheduler-config"])

    assert checksum(_scheduler()[0]) == checksum(_scheduler()[0]) != checksum(moved)
