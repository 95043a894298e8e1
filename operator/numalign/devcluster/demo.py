"""``numalign dev up --demo``: the local control plane with the operator, emulated nodes of
the machine files in ``config/samples/machines/`` and the sample TopologyPolicies and
workloads of ``config/samples/``, waited on until they settle.

Steps (each logged with its time): build or reuse the binaries, start or reuse the control
plane, the operator and the emulated nodes, label the GPU pool, apply the
TopologyPolicies and wait until the operator has reported them, apply the namespaces and
workloads, wait until every sample Deployment is available and every NodeTopology shows
its pods. Running it again reuses the running cluster and re-applies the samples
(``kubectl apply``: unchanged objects stay unchanged).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from numalign.api.kube import SyncKube
from numalign.api.names import (
    EVENT_INVALID_OVERRIDE,
    EVENT_REDEPLOY,
    EVENT_REDEPLOY_GAVE_UP,
    EVENT_REDEPLOY_REPEAT,
    REJECT_REASON,
)

from .addons import MachineSpec
from .cluster import DevCluster, DevClusterError

Log = Callable[[str], None]
Obj = dict[str, Any]

REPO = Path(__file__).resolve().parents[3]
SAMPLES = REPO / "config" / "samples"

# (machine file in config/samples/machines/, node count); nodes are <name>-<i>.
MACHINES: tuple[tuple[str, int], ...] = (
    ("seed-figure1", 1),
    ("dual-16core", 1),
    ("fragmented-8numa", 1),
    ("dgx-a100-like", 1),
    ("group4-gpu", 2),
)
# Labels the samples select nodes by: the ml-training policy and the trainer Deployment
# want pool=gpu, which the group4-gpu nodes (NVLink pairs) form.
NODE_LABELS: dict[str, dict[str, str]] = {"group4-gpu": {"pool": "gpu"}}
SETTLE_TIMEOUT = 120.0
# The sample whose story is the node-side rejection and the redeploy: with the scheduler
# extender on, the demo applies it while the extender is stopped (the scheduler goes on
# without it), because the extender would place it right the first time.
BACKSTOP_NAMESPACE = "rt"
STORY_REASONS = (REJECT_REASON, EVENT_REDEPLOY, EVENT_REDEPLOY_GAVE_UP, EVENT_REDEPLOY_REPEAT,
                 EVENT_INVALID_OVERRIDE)


class DemoError(DevClusterError):
    """The demo could not run to the end; the message says what to do next."""


@dataclass
class DemoResult:
    kubeconfig: Path
    nodes: list[str]
    namespaces: list[str]
    settled: bool
    unsettled: list[str] = field(default_factory=list)
    seconds: float = 0.0


def demo_machines(samples: Path = SAMPLES) -> list[MachineSpec]:
    machines = samples / "machines"
    specs: list[MachineSpec] = []
    for name, count in MACHINES:
        path = machines / f"{name}.yaml"
        if not path.is_file():
            raise DemoError(f"machine file {path} is missing: the demo runs from a clone of "
                            "the repository (make demo), or pass --samples DIR with a "
                            "machines/ folder")
        specs.append(MachineSpec(path.resolve(), count))
    return specs


def node_names(machines: Sequence[MachineSpec]) -> dict[str, str]:
    """Emulated node name -> machine name, as the agent names them."""
    out: dict[str, str] = {}
    for m in machines:
        name = str((yaml.safe_load(m.path.read_text()) or {}).get("name") or m.path.stem)
        for i in range(m.count):
            out[f"{name}-{i}"] = name
    return out


class Kubectl:
    """``kubectl`` bound to one kubeconfig; errors raise DemoError with its stderr."""

    def __init__(self, kubeconfig: Path) -> None:
        exe = shutil.which("kubectl")
        if exe is None:
            raise DemoError("kubectl is not on PATH: install kubectl "
                            "(https://kubernetes.io/docs/tasks/tools/) and run again")
        self.exe = exe
        self.env = dict(os.environ, KUBECONFIG=str(kubeconfig))

    def __call__(self, *args: str, input: str | None = None, timeout: float = 60.0) -> str:
        proc = subprocess.run([self.exe, *args], input=input, capture_output=True, text=True,
                              env=self.env, timeout=timeout, check=False)
        if proc.returncode != 0:
            err = "\n".join(line for line in proc.stderr.splitlines()
                            if "version difference between client" not in line)
            raise DemoError(f"'kubectl {' '.join(args)}' failed: {err.strip()}")
        return proc.stdout


def render_samples(kubectl: Kubectl, samples: Path) -> list[Obj]:
    if not (samples / "kustomization.yaml").is_file():
        raise DemoError(f"no kustomization.yaml in {samples}: the demo runs from a clone of "
                        "the repository (make demo), or pass --samples DIR")
    docs = yaml.safe_load_all(kubectl("kustomize", str(samples)))
    return [d for d in docs if isinstance(d, dict)]


def _conditions(obj: Any) -> list[Obj]:
    status = obj.get("status") if isinstance(obj, dict) else None
    conds = (status or {}).get("conditions") or []
    return [c for c in conds if isinstance(c, dict)]


def _items(kube: SyncKube, path: str) -> list[Obj]:
    body = kube.get_quiet(path)
    if body is None:
        return []
    return [i for i in body.get("items") or [] if isinstance(i, dict)]


def _wait(what: str, check: Callable[[], list[str]], timeout: float,
          interval: float = 0.5) -> list[str]:
    """Poll ``check`` (what is still missing) until it is empty or ``timeout`` passes;
    return what was still missing (empty: done)."""
    deadline = time.monotonic() + timeout
    while True:
        missing = check()
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(interval)


class Demo:
    def __init__(self, cluster: DevCluster, samples: Path = SAMPLES, log: Log | None = None,
                 settle_timeout: float = SETTLE_TIMEOUT, extender: bool = True) -> None:
        self.cluster = cluster
        self.extender = extender
        self.samples = samples
        self.say: Log = log or (lambda _m: None)
        self.settle_timeout = settle_timeout

    def _step(self, t0: float, message: str) -> None:
        self.say(f"demo: {message} ({time.monotonic() - t0:.1f}s)")

    def check_reuse(self, machines: Sequence[MachineSpec]) -> None:
        """Refuse to add the demo to a running cluster whose agent emulates other machines
        (it would wait for nodes that never come)."""
        if not self.cluster.is_running():
            return
        agent = self.cluster.process("agent")
        recorded = {(str(m.get("path")), int(m.get("count", 1)))
                    for m in self.cluster.state().get("machines", [])}
        wanted = {(str(m.path), m.count) for m in machines}
        if agent.is_running() and recorded != wanted:
            raise DemoError(
                f"the dev cluster in {self.cluster.state_dir} already runs emulated nodes of "
                "other machines: stop it with 'numalign dev down' (or give the demo its own "
                "cluster with --name demo) and run the demo again")

    def run(self, *, timeout: float, extra: Sequence[MachineSpec] = ()) -> DemoResult:
        t_all = time.monotonic()
        machines = [*demo_machines(self.samples), *extra]
        self.check_reuse(machines)
        kubectl = Kubectl(self.cluster.kubeconfig)
        objs = render_samples(kubectl, self.samples)  # fail early on a broken samples dir

        t = time.monotonic()
        self.cluster.up(machines=machines, operator=True, log=self.say, timeout=timeout,
                        scheduler_extender=self.extender, extender=self.extender)
        self._step(t, "control plane, operator, agent" + (" and scheduler extender"
                                                         if self.extender else "") + " up")
        kube = self.cluster.kube()
        nodes = node_names(machines)

        t = time.monotonic()
        missing = _wait("nodes", lambda: self._nodes_not_ready(kube, nodes), timeout)
        if missing:
            raise DemoError(
                f"emulated nodes not Ready after {timeout:.0f}s: {', '.join(missing)}; see "
                f"{self.cluster.log_file('agent')}. Run 'numalign dev down' and try again.")
        self._step(t, f"{len(nodes)} emulated nodes Ready: {', '.join(nodes)}")

        t = time.monotonic()
        for node, machine in nodes.items():
            labels = NODE_LABELS.get(machine)
            if labels:
                kubectl("label", "node", node, "--overwrite",
                        *(f"{k}={v}" for k, v in labels.items()))
        policies = [o for o in objs if o.get("kind") == "TopologyPolicy"]
        rest_objs = [o for o in objs if o.get("kind") != "TopologyPolicy"]
        if policies:
            kubectl("apply", "-f", "-", input=yaml.safe_dump_all(policies))
        names = [str(p["metadata"]["name"]) for p in policies]
        missing = _wait("policies", lambda: self._policies_not_reported(kube, names),
                        min(timeout, 60.0))
        if missing:
            raise DemoError(
                f"the operator did not report TopologyPolicies {', '.join(missing)} within "
                f"60s; see {self.cluster.log_file('operator')}")
        self._step(t, f"TopologyPolicies applied and reported: {', '.join(names)}")

        t = time.monotonic()
        backstop = [o for o in rest_objs if _in_namespace(o, BACKSTOP_NAMESPACE)]
        if self.extender and backstop and self.cluster.extender_url is not None:
            self._without_extender(kubectl, kube, backstop)
            self._step(t, f"namespace {BACKSTOP_NAMESPACE} applied with the scheduler "
                          "extender stopped (the node rejects, the operator redeploys)")
            t = time.monotonic()
            rest_objs = [o for o in rest_objs if o not in backstop]
        kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rest_objs))
        rest_objs += backstop
        namespaces = sorted({str(o["metadata"]["name"]) for o in rest_objs
                             if o.get("kind") == "Namespace"}
                            | {str(o["metadata"]["namespace"]) for o in rest_objs
                               if o.get("metadata", {}).get("namespace")})
        deployments = [(str(o["metadata"]["namespace"]), str(o["metadata"]["name"]))
                       for o in rest_objs if o.get("kind") == "Deployment"]
        self._step(t, f"sample workloads applied in namespaces {', '.join(namespaces)}")

        t = time.monotonic()
        unsettled = _wait("settle", lambda: self._unsettled(kube, deployments, namespaces,
                                                           list(nodes)),
                          self.settle_timeout, interval=1.0)
        if unsettled:
            self.say(f"demo: not settled after {self.settle_timeout:.0f}s: "
                     f"{'; '.join(unsettled)} (see the logs in {self.cluster.state_dir / 'logs'})")
        else:
            self._step(t, "workloads settled")
        return DemoResult(kubeconfig=self.cluster.kubeconfig, nodes=list(nodes),
                          namespaces=namespaces, settled=not unsettled, unsettled=unsettled,
                          seconds=time.monotonic() - t_all)

    def _without_extender(self, kubectl: Kubectl, kube: SyncKube, objs: list[Obj]) -> None:
        """Apply ``objs`` while the extender is stopped, until their pods are bound."""
        self.cluster.stop_extender()
        try:
            kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objs))
            path = f"/api/v1/namespaces/{quote(BACKSTOP_NAMESPACE)}/pods"
            _wait("bound", lambda: [] if any((p.get("spec") or {}).get("nodeName")
                                             for p in _items(kube, path)) else ["unbound"],
                  60.0)
        finally:
            self.cluster.start_extender(self.say)

    # ------------------------------------------------------------------ conditions

    @staticmethod
    def _nodes_not_ready(kube: SyncKube, nodes: dict[str, str]) -> list[str]:
        ready = {str(n["metadata"]["name"]) for n in _items(kube, "/api/v1/nodes")
                 if any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in _conditions(n))}
        return [n for n in nodes if n not in ready]

    @staticmethod
    def _policies_not_reported(kube: SyncKube, names: list[str]) -> list[str]:
        reported = {str(p["metadata"]["name"])
                    for p in _items(kube, "/apis/numalign.io/v1alpha1/topologypolicies")
                    if (p.get("status") or {}).get("observedGeneration")
                    == p["metadata"].get("generation")}
        return [n for n in names if n not in reported]

    @staticmethod
    def _unsettled(kube: SyncKube, deployments: list[tuple[str, str]], namespaces: list[str],
                   nodes: list[str]) -> list[str]:
        out: list[str] = []
        for ns, name in deployments:
            d = kube.get_quiet(f"/apis/apps/v1/namespaces/{quote(ns)}/deployments/"
                               f"{quote(name)}")
            if d is None:
                out.append(f"{ns}/{name} not found")
                continue
            want = int((d.get("spec") or {}).get("replicas", 1))
            st = d.get("status") or {}
            if st.get("observedGeneration") != d["metadata"].get("generation") or any(
                    int(st.get(k) or 0) != want
                    for k in ("replicas", "updatedReplicas", "availableReplicas")):
                out.append(f"{ns}/{name} {int(st.get('availableReplicas') or 0)}/{want} "
                           "available")
        running: set[str] = set()
        for ns in namespaces:
            for pod in _items(kube, f"/api/v1/namespaces/{quote(ns)}/pods"):
                phase = (pod.get("status") or {}).get("phase")
                pod_id = f"{ns}/{pod['metadata']['name']}"
                if phase == "Running":
                    running.add(pod_id)
                elif phase in ("Pending", "Failed"):
                    out.append(f"pod {pod_id} {phase}")
        published: set[str] = set()
        nts = {str(nt["metadata"]["name"]): nt
               for nt in _items(kube, "/apis/numalign.io/v1alpha1/nodetopologies")}
        for node in nodes:
            if node not in nts:
                out.append(f"NodeTopology {node} not published")
                continue
            for a in (nts[node].get("status") or {}).get("admitted") or []:
                published.add(f"{a.get('namespace')}/{a.get('pod')}")
        lagging = sorted(running - published)
        if lagging:
            out.append(f"not yet in a NodeTopology: {', '.join(lagging)}")
        return out


def _in_namespace(obj: Obj, namespace: str) -> bool:
    meta = obj.get("metadata") or {}
    if obj.get("kind") == "Namespace":
        return bool(meta.get("name") == namespace)
    return bool(meta.get("namespace") == namespace)


def story(kube: SyncKube, namespaces: Sequence[str]) -> list[str]:
    """The rejections and redeploys in the sample namespaces, oldest first."""
    events: list[tuple[str, str]] = []
    for ns in namespaces:
        for ev in _items(kube, f"/api/v1/namespaces/{quote(ns)}/events"):
            if ev.get("reason") not in STORY_REASONS:
                continue
            obj = ev.get("involvedObject") or {}
            when = str(ev.get("lastTimestamp") or ev.get("eventTime") or "")
            src = (ev.get("source") or {}).get("host") or ev.get("reportingInstance") or ""
            where = f" on {src}" if src and ev.get("reason") == REJECT_REASON else ""
            events.append((when, f"{ns}/{obj.get('name')}: {ev.get('reason')}{where}: "
                                 f"{str(ev.get('message') or '').strip()}"))
    return [text for _when, text in sorted(events)]


def pods_of(kube: SyncKube, namespace: str) -> list[str]:
    return sorted(str(p["metadata"]["name"])
                  for p in _items(kube, f"/api/v1/namespaces/{quote(namespace)}/pods")
                  if (p.get("status") or {}).get("phase") == "Running")
