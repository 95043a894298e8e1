"""A real node in the dev cluster: containerd (with runc, the CNI plugins and NRI) and a
kubelet that sees a machine file's NUMA layout, registered with the local API server.

    node = RealNode(cluster, machine_file)               # the kubelet's managers place
    node = RealNode(cluster, machine_file, mode="nri")   # numalign places, through NRI
    node.up(log=print)     # build (cached), configure, start, wait until the Node is Ready
    node.down()            # stop it and remove its containers, mounts, cgroups and netns

Everything lives under ``<cluster state>/realnode/``: ``sys/`` (the sysfs view the kubelet
sees, see :mod:`numalign.devcluster.sysfsview`), ``kubelet/`` (its root dir: the
pod-resources and device-plugin sockets), ``kubelet-config.yaml``, ``containerd/`` (root,
state, config and socket), ``images/`` (the OCI archives imported into containerd),
``logs/`` and ``run/``. The kubelet runs in a mount namespace of its own where the sysfs view
is laid over ``/sys/devices/system/{node,cpu}``; its root dir is a shared mount, so the
volumes it mounts there reach containerd. It listens on 127.0.0.1 only; the API server
reaches it by its Hostname address, the node name ``localhost``.

With ``dra`` (``dev up --real-node --dra``) the machine file's devices come through a DRA
kubelet plugin (:mod:`numalign.devcluster.draplugin`, driver ``dra.numalign.io``, its
DeviceClasses installed) instead of the sample device plugin; containerd injects the
prepared devices from the CDI specs it writes in ``containerd/cdi/``.

In ``nri`` mode (:mod:`numalign.devcluster.realnode_config`) the kubelet's CPU, memory and
Topology managers are ``none``, the Node is labelled ``numalign.io/managed=nri`` and the
agent is started with containerd's NRI socket (``containerd/nri.sock``), where this
numalign's agent has ``--nri-socket``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from numalign.api.kube import REQUEST_ERRORS, nt_path
from numalign.api.names import NRI_PLUGIN_NAME, SOURCE_KUBELET
from numalign.topology.machine import Machine, load_machine
from numalign.topology.policies import kubelet_names
from numalign.topology.policyconfig import SCOPES

from . import certs, kubeproxy, realnode_dra
from .addons import metrics_flags, metrics_url
from .cluster import DevCluster, DevClusterError, Log, on_down, write_kubeconfig
from .crds import NRT_CRD
from .draplugin import DRIVER as DRA_DRIVER
from .hostcgroups import (
    cgroup_hierarchies,
    node_digest,
)
from .images import build_images
from .nodebuild import ensure_node_built, node_bin_dir
from .processes import Process, free_ports
from .realnode_config import (
    CONTAINERD_DIRS,
    MODE_KUBELET,
    MODE_NRI,
    MODES,
    cni_conflist,
    containerd_config,
    kubelet_configuration,
    node_labels,
)
from .realnode_config import TAINT as TAINT  # the node's taint, for callers of this module
from .realnode_down import DEVICE_PLUGINS, tear_down
from .sysfsview import SysfsViewError, map_onto, usable_cpus, write_sysfs_view

NODE_NAME = "localhost"  # resolves to 127.0.0.1: the API server's way to the kubelet
DEFAULT_POLICY = "single-numa-node"
DEFAULT_SCOPE = "container"
K8S_NAMESPACE = "k8s.io"  # containerd's namespace for the CRI
PROCESSES = ("containerd", "kubelet", "kube-proxy", "device-plugin", "dra-plugin", "agent")


class RealNodeError(DevClusterError):
    """The real node could not be started; the message says why and what to do."""


def _quiet(_m: str) -> None:
    pass


def cannot_run_containers() -> str | None:
    """Why this machine cannot run the real node's containers, or None when it can."""
    if sys.platform != "linux":
        return "containers need Linux"
    if os.geteuid() != 0:
        return "the real node runs containers and needs root"
    if not cgroup_hierarchies():
        return "no cgroup file system is mounted under /sys/fs/cgroup"
    for tool in ("unshare", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"'{tool}' (util-linux) is not installed"
    return None


class RealNode:
    def __init__(self, cluster: DevCluster, machine_file: Path | None = None, *,
                 policy: str | None = None, scope: str | None = None,
                 mode: str = MODE_KUBELET, host_agent: bool = True,
                 dra: bool = False) -> None:
        """``host_agent``: run numalign's agent for this node as a host process (False:
        numalign is installed into the cluster, its DaemonSet's pod is the agent);
        ``dra``: the devices through the DRA kubelet plugin, not the device plugin."""
        if mode not in MODES:
            raise RealNodeError(f"real node mode {mode!r}: expected one of {', '.join(MODES)}")
        if mode == MODE_NRI and (policy is not None or scope is not None):
            raise RealNodeError("a topology policy/scope sets the kubelet's Topology Manager; "
                                "in nri mode it is none and each pod's resolved policy "
                                "decides (a TopologyPolicy, the pod's override)")
        self.cluster = cluster
        self.machine_file = machine_file
        self.policy = policy
        self.scope = scope
        self.mode = mode
        self.host_agent = host_agent
        self.dra = dra
        self.dir = cluster.state_dir / "realnode"
        self.name = NODE_NAME
        digest = node_digest(cluster.state_dir)
        self.bridge = f"nal{digest}"
        self.cgroup_root = f"/numalign-{digest}"
        self._procs: dict[str, Process] = {}

    # ----------------------------------------------------------------- paths

    @property
    def kubelet_dir(self) -> Path:
        return self.dir / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.dir / "kubelet-config.yaml"

    @property
    def containerd_dir(self) -> Path:
        return self.dir / "containerd"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd_dir / "containerd.sock"

    @property
    def nri_socket(self) -> Path:
        """containerd's NRI socket, where an NRI plugin registers."""
        return self.containerd_dir / "nri.sock"

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_dir / "pod-resources" / "kubelet.sock"

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    def state(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.state_file.read_text())
            return data
        except (OSError, ValueError):
            return {}

    def machine(self) -> Machine:
        """The machine the kubelet sees: the machine file mapped onto this machine's CPUs."""
        path = self.machine_file or Path(self.state().get("machine") or "")
        return map_onto(load_machine(path), usable_cpus())

    def process(self, name: str) -> Process:
        if name not in self._procs:
            self._procs[name] = Process(name, self.dir / "run", self.dir / "logs",
                                        die_with_parent=self.cluster.ephemeral)
        return self._procs[name]

    def metrics_url(self, name: str) -> str | None:
        """Where component ``name`` serves Prometheus metrics: the kubelet on its
        authenticated port (a client certificate of the cluster's CA), the agent on
        loopback."""
        st = self.state()
        if name == "kubelet":
            port = (st.get("ports") or {}).get("kubelet")
            return f"https://127.0.0.1:{port}/metrics" if port else None
        return metrics_url(((st.get("commands") or {}).get(name) or {}).get("argv"))

    def log_file(self, name: str) -> Path:
        return self.process(name).log_file

    def ctr(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run ``ctr`` against this node's containerd, in the CRI's namespace."""
        return subprocess.run(
            [str(node_bin_dir() / "ctr"), "--address", str(self.containerd_socket),
             "--namespace", K8S_NAMESPACE, *args],
            capture_output=True, text=True, timeout=timeout, check=False)

    # ----------------------------------------------------------------- up

    def up(self, log: Log | None = None, timeout: float = 240.0) -> RealNode:
        """Start the real node (stopping a previous one first); wait until it is Ready."""
        say = log or _quiet
        reason = cannot_run_containers()
        if reason is not None:
            raise RealNodeError(f"this machine cannot run the real node: {reason}")
        if not self.cluster.is_running():
            raise RealNodeError("the control plane is not running: 'numalign dev up' first")
        if self.machine_file is None:
            raise RealNodeError("a real node needs a machine file (--machine FILE)")
        machine = load_machine(self.machine_file)
        t0 = time.monotonic()
        root = ensure_node_built(log=say)
        say(f"real node binaries ready in {root} ({time.monotonic() - t0:.1f}s)")
        if self.dir.exists():
            self.down(say)
        t = time.monotonic()
        self.dir.mkdir(parents=True)
        try:
            mapped = write_sysfs_view(machine, self.dir)
        except SysfsViewError as e:
            raise RealNodeError(f"{self.machine_file}: {e}") from None
        cpus = sorted(mapped.cpus)
        policy, scope = self._policy(say) if self.mode == MODE_KUBELET else ("none",
                                                                            "container")
        # Pods reach Services (kube-proxy; the bridge their gateway) where the API server
        # listens on an address they can reach.
        services = bool(self.cluster.state().get("hostAddress"))
        names = ("kubelet", "healthz", "kube-proxy-healthz", "kube-proxy-metrics")
        ports = dict(zip(names, free_ports(len(names)), strict=True))
        self._save_state({"name": self.name, "mode": self.mode, "services": services,
                          **({"dra": True} if self.dra else {}),
                          "machine": str(self.machine_file),
                          "bridge": self.bridge, "cgroupRoot": self.cgroup_root,
                          "ports": ports, "policy": policy, "scope": scope,
                          "reservedCPUs": str(cpus[0])})
        self._make_cgroups()
        self._write_containerd_config(gateway=services)
        self._write_kubelet_files(ports, policy, scope, str(cpus[0]))
        say(f"real node configured: {machine.name} on CPUs {cpus}, {self.mode} mode, "
            f"Topology Manager policy {policy}, scope {scope} ({time.monotonic() - t:.1f}s)")
        deadline = time.monotonic() + timeout
        try:
            t = time.monotonic()
            self._start_containerd(deadline)
            say(f"containerd ready ({time.monotonic() - t:.1f}s)")
            t = time.monotonic()
            self._import_images(say)
            say(f"images imported ({time.monotonic() - t:.1f}s)")
            t = time.monotonic()
            self._start_kubelet(deadline)
            self._label()
            say(f"kubelet registered node {self.name}, Ready ({time.monotonic() - t:.1f}s)")
            if services:
                t = time.monotonic()
                self._start_kube_proxy(ports, deadline)
                say(f"kube-proxy serves the Services ({time.monotonic() - t:.1f}s)")
            self._start_helpers(say, deadline)
        except BaseException:
            self.down(keep_logs=True)
            raise
        say(f"real node {self.name} up in {time.monotonic() - t0:.1f}s "
            f"(logs in {self.dir / 'logs'})")
        return self

    def _policy(self, say: Log) -> tuple[str, str]:
        """The Topology Manager policy and scope: as given, else the node's NodeTopology
        default, else single-numa-node/container."""
        policy, scope = self.policy, self.scope
        if policy is None or scope is None:
            body = self.cluster.kube().get_quiet(
                f"/apis/numalign.io/v1alpha1/nodetopologies/{self.name}")
            spec = (body or {}).get("spec") or {}
            if spec.get("policy") and policy is None:
                policy = str(spec["policy"])
                say(f"Topology Manager policy {policy} from NodeTopology {self.name}")
            if spec.get("scope") and scope is None:
                scope = str(spec["scope"])
        policy, scope = policy or DEFAULT_POLICY, scope or DEFAULT_SCOPE
        if policy not in kubelet_names():  # a real kubelet knows only its own
            raise RealNodeError(f"topology policy {policy!r}: expected one of "
                                f"{', '.join(kubelet_names())}")
        if scope not in SCOPES:
            raise RealNodeError(f"topology scope {scope!r}: expected one of "
                                f"{', '.join(SCOPES)}")
        return policy, scope

    def _make_cgroups(self) -> None:
        """The kubelet's cgroup root in every hierarchy (it must exist before it starts)."""
        for h in cgroup_hierarchies():
            d = h / self.cgroup_root.lstrip("/")
            d.mkdir(exist_ok=True)
            for f in ("cpuset.cpus", "cpuset.mems"):
                if (h / f).is_file() and (d / f).is_file() and not (d / f).read_text().strip():
                    (d / f).write_text((h / f).read_text())

    def _write_containerd_config(self, gateway: bool = False) -> None:
        d = self.containerd_dir
        for sub in CONTAINERD_DIRS:
            (d / sub).mkdir(parents=True, exist_ok=True)
        conflist = cni_conflist(self.bridge, d / "cni" / "ipam", gateway)
        (d / "cni/conf/10-numalign.conflist").write_text(json.dumps(conflist, indent=2) + "\n")
        required = NRI_PLUGIN_NAME if self.mode == MODE_NRI else None
        (d / "config.toml").write_text(containerd_config(d, self.containerd_socket,
                                                         self.nri_socket, required))

    def _write_kubelet_files(self, ports: dict[str, int], policy: str, scope: str,
                             reserved: str) -> None:
        pki = self.cluster.pki
        (self.kubelet_dir / "pki").mkdir(parents=True, exist_ok=True)
        pair = certs.KeyPair(self.dir / "kubelet-client.crt", self.dir / "kubelet-client.key")
        certs.issue_client(pki, pair, f"system:node:{self.name}", org="system:nodes")
        server = self.cluster.server or ""
        write_kubeconfig(self.dir / "kubelet.kubeconfig", f"numalign-{self.cluster.name}",
                         server, pki.ca.cert, pair.cert, pair.key, f"system:node:{self.name}")
        config = kubelet_configuration(
            ports=ports, policy=policy, scope=scope, reserved=reserved,
            cgroup_root=self.cgroup_root, ca_cert=pki.ca.cert,
            endpoint=f"unix://{self.containerd_socket}", pod_logs=self.dir / "pod-logs",
            mode=self.mode)
        self.kubelet_config.write_text(yaml.safe_dump(config, sort_keys=False))

    def _start_containerd(self, deadline: float) -> None:
        bins = node_bin_dir()
        env = dict(os.environ, PATH=f"{bins}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        self._start("containerd",
            [str(bins / "containerd"), "--config", str(self.containerd_dir / "config.toml"),
             "--log-level", "info"], env=env)

        def ready() -> bool:
            return (self.containerd_socket.exists()
                    and self.ctr("version", timeout=10).returncode == 0)

        self._wait("containerd", ready, deadline, ("containerd",))

    def _import_images(self, say: Log) -> None:
        for archive in build_images(self.dir / "images", log=say):
            self.import_archive(archive)

    def import_archive(self, archive: Path) -> None:
        """Import an OCI archive into this node's containerd (the kubelet's namespace),
        unpacked, under the name its index gives it."""
        proc = self.ctr("images", "import", "--no-unpack=false", str(archive), timeout=300)
        if proc.returncode != 0:
            raise RealNodeError(f"'ctr images import {archive.name}' failed: "
                                f"{(proc.stderr or proc.stdout).strip()[-800:]}")

    def _start_kubelet(self, deadline: float) -> None:
        # Own mount namespace: the sysfs view over /sys/devices/system/{node,cpu} is the
        # kubelet's alone; its root dir, a shared mount, carries its volumes to containerd.
        kdir = self.kubelet_dir
        subprocess.run(["mount", "--bind", str(kdir), str(kdir)], check=True)
        subprocess.run(["mount", "--make-shared", str(kdir)], check=True)
        (kdir / "device-plugins").mkdir(exist_ok=True)
        DEVICE_PLUGINS.mkdir(parents=True, exist_ok=True)  # a mount point, empty on the host
        view = self.dir / "sys/devices/system"
        kubelet = [
            str(node_bin_dir() / "kubelet"),
            f"--config={self.kubelet_config}",
            f"--kubeconfig={self.dir / 'kubelet.kubeconfig'}",
            f"--root-dir={kdir}",
            f"--cert-dir={kdir / 'pki'}",
            f"--hostname-override={self.name}",
            "--v=2",
        ]
        labels = node_labels(self.mode)
        if labels:
            kubelet.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in labels.items()))
        binds = [(f"{view}/node", "/sys/devices/system/node"),
                 (f"{view}/cpu", "/sys/devices/system/cpu"),
                 (str(kdir / "device-plugins"), str(DEVICE_PLUGINS))]
        # Each target's mount is made private first (only in this namespace), so that the
        # binds never propagate back to the host, whatever its propagation settings.
        script = "set -e; " + "".join(
            f"mount --make-private \"$(stat -c %m '{dst}')\"; mount --bind '{src}' '{dst}'; "
            for src, dst in binds) + 'exec "$@"'
        self._start("kubelet",
            ["unshare", "--mount", "--propagation", "unchanged", "--", "sh", "-c", script,
             "kubelet", *kubelet], program="kubelet")
        self._wait_ready(deadline)

    def _label(self) -> None:
        """The Node's mode labels as this mode has them, also where the Node outlived an
        earlier kubelet (--node-labels only label a Node the kubelet creates)."""
        want: dict[str, str | None] = {k: None for k in node_labels(MODE_NRI)}
        want.update(node_labels(self.mode))
        try:
            self.cluster.kube().patch(f"/api/v1/nodes/{self.name}",
                                      {"metadata": {"labels": want}})
        except REQUEST_ERRORS as exc:
            raise RealNodeError(f"could not label node {self.name}: {exc}") from None

    def _numalign(self) -> list[str]:
        script = Path(sys.executable).with_name("numalign")
        if script.is_file():
            return [sys.executable, str(script)]
        return [sys.executable, "-c", "import sys; from numalign.cli import main; "
                "sys.exit(main())"]

    def _advertised(self, resources: list[str]) -> bool:
        """Whether the Node's allocatable lists every one of ``resources``."""
        body = self.cluster.kube().get_quiet(f"/api/v1/nodes/{self.name}")
        alloc = ((body or {}).get("status") or {}).get("allocatable") or {}
        return all(alloc.get(r) not in (None, "0") for r in resources)

    def _start_kube_proxy(self, ports: dict[str, int], deadline: float) -> None:
        config = kubeproxy.write_files(self.cluster, self.name, self.dir, ports)
        self._start("kube-proxy", kubeproxy.argv(config), program="kube-proxy")
        self._wait("kube-proxy's /healthz", lambda: self._healthy("kube-proxy-healthz"),
                   deadline, ("kube-proxy",))

    def _start_helpers(self, say: Log, deadline: float) -> None:
        """The sample device plugin (or the DRA plugin) and the real-node agent."""
        env = dict(os.environ, KUBECONFIG=str(self.cluster.kubeconfig))
        assert self.machine_file is not None
        if self.dra:
            self._start_dra_plugin(env, say, deadline)
        else:
            self._start_device_plugin(env, say, deadline)
        if not self.host_agent:
            return
        # one identity across restarts: a restarted agent takes its node's Lease at once
        self._start("agent", self._agent_argv(say),
                    env=dict(env, POD_NAME=f"numalign-agent-{self.name}"), program="numalign")
        t = time.monotonic()
        self._wait(f"the agent to publish NodeTopology {self.name}", self._published, deadline,
                   ("agent",))
        say(f"started the real-node agent; NodeTopology {self.name} published "
            f"({time.monotonic() - t:.1f}s)")

    def _start_dra_plugin(self, env: dict[str, str], say: Log, deadline: float) -> None:
        assert self.machine_file is not None
        kube = self.cluster.kube()
        realnode_dra.install_classes(kube, self.machine_file, say)
        t = time.monotonic()
        self._start("dra-plugin", realnode_dra.plugin_argv(
            self._numalign(), self.machine_file, self.kubelet_dir, self.containerd_dir / "cdi",
            self.name), env=env, program="numalign")
        self._wait(f"the DRA plugin ({DRA_DRIVER}) to register and publish its "
                   "ResourceSlices", lambda: realnode_dra.published_slices(kube, self.name) > 0,
                   deadline, ("kubelet", "dra-plugin"))
        say(f"the DRA kubelet plugin {DRA_DRIVER} is registered and publishes the "
            f"node's devices ({time.monotonic() - t:.1f}s)")

    def _start_device_plugin(self, env: dict[str, str], say: Log, deadline: float) -> None:
        assert self.machine_file is not None
        self._start("device-plugin",
            [*self._numalign(), "dev", "device-plugin", "--machine", str(self.machine_file),
             "--kubelet-dir", str(self.kubelet_dir)], env=env, program="numalign")
        resources = sorted({d.resource for d in load_machine(self.machine_file).devices}
                           or {"numalign.io/sample-device"})
        self._wait(f"the device plugin to advertise {', '.join(resources)}",
                   lambda: self._advertised(resources), deadline, ("kubelet", "device-plugin"))
        say(f"the sample device plugin advertises {', '.join(resources)}")

    def _published(self) -> bool:
        """Whether the node's NodeTopology has its agent's status (kubectl get nt lists it)
        and, where the operator runs, the policy that applies (on a kubelet-managed node
        the kubelet's) applied."""
        body = self.cluster.kube().get_quiet(nt_path(self.name)) or {}
        spec, status = body.get("spec") or {}, body.get("status") or {}
        if not status.get("zones"):
            return False
        if not self.cluster.process("operator").is_running():
            return True
        if self.mode == MODE_KUBELET and spec.get("source") != SOURCE_KUBELET:
            return False
        return bool(status.get("observedPolicyGeneration") == spec.get("policyGeneration"))

    def _agent_argv(self, say: Log) -> list[str]:
        """The real-node agent's command line; in nri mode with containerd's NRI socket, so
        that it registers as an NRI plugin and places the containers."""
        argv = [*self._numalign(), "agent", "--node", self.name, "--root", str(self.dir),
                "--pod-resources", str(self.pod_resources_socket),
                "--kubelet-config", str(self.kubelet_config), *metrics_flags()]
        if NRT_CRD.is_file():  # installed with the CRDs (devcluster/crds.py)
            argv.append("--publish-nrt")
        if self.mode == MODE_NRI:
            argv += ["--nri-socket", str(self.nri_socket)]
            say(f"the agent places containers through NRI ({self.nri_socket})")
        return argv

    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None,
               program: str | None = None) -> None:
        """Start component ``name``; what restart() needs is kept in the state file."""
        self.process(name).start(argv, env=env, program=program)
        st = self.state()
        st.setdefault("commands", {})[name] = {"argv": argv, "env": env, "program": program}
        self._save_state(st)

    def restart(self, name: str, log: Log | None = None, timeout: float = 120.0,
                between: Callable[[], None] | None = None) -> None:
        """Stop component ``name`` (kubelet, containerd, device-plugin or agent) and start
        it again as before; the kubelet: wait until the Node is Ready again. Its pods keep
        running meanwhile (containerd holds them; the kubelet recovers its checkpoints)."""
        say = log or _quiet
        cmd = (self.state().get("commands") or {}).get(name)
        if cmd is None:
            raise RealNodeError(f"the real node has no {name} to restart "
                                f"(one of {', '.join(PROCESSES)})")
        t = time.monotonic()
        self.process(name).stop(timeout=10)
        if between is not None:
            between()
        self.process(name).start(cmd["argv"], env=cmd["env"], program=cmd["program"])
        if name == "kubelet":
            deadline = time.monotonic() + timeout
            self._wait("the restarted kubelet's /healthz", self._healthy, deadline,
                       ("kubelet",))
            self._wait_ready(deadline)
        say(f"{name} restarted ({time.monotonic() - t:.1f}s)")

    def _healthy(self, port_name: str = "healthz") -> bool:
        """The component on loopback port ``port_name`` (state.json) answers /healthz."""
        port = (self.state().get("ports") or {}).get(port_name)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def _node_ready(self) -> bool:
        body = self.cluster.kube().get_quiet(f"/api/v1/nodes/{self.name}")
        if body is None:
            return False
        return any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in (body.get("status") or {}).get("conditions") or [])

    def _wait_ready(self, deadline: float) -> None:
        self._wait(f"node {self.name} to be Ready", self._node_ready, deadline,
                   ("containerd", "kubelet"))

    def _wait(self, what: str, ready: Callable[[], bool], deadline: float,
              components: tuple[str, ...]) -> None:
        while not ready():
            for name in components:
                proc = self.process(name)
                if not proc.is_running():
                    raise RealNodeError(f"{name} exited while waiting for {what}; its log "
                                        f"({proc.log_file}) ends with:\n{proc.log_tail()}")
            if time.monotonic() > deadline:
                raise RealNodeError(f"timed out waiting for {what}; see the logs in "
                                    f"{self.dir / 'logs'}")
            time.sleep(0.5)

    def _save_state(self, data: dict[str, Any]) -> None:
        self.state_file.write_text(json.dumps(data, indent=2) + "\n")

    # ----------------------------------------------------------------- down

    def is_running(self) -> bool:
        return all(self.process(n).is_running() for n in ("containerd", "kubelet"))

    def down(self, log: Log | None = None, keep_logs: bool = False) -> bool:
        """Stop everything and remove the containers, mounts, cgroups, network and state
        (``keep_logs``: all but ``logs/``, e.g. after a failed start); False when there was
        no real node. Works from what is on disk alone (:mod:`.realnode_down`)."""
        return tear_down(self, log or _quiet, keep_logs)


@on_down
def _stop_real_node(cluster: DevCluster, say: Log) -> None:
    """A cluster stopping stops its real node first (when it has one)."""
    folder = cluster.state_dir / "realnode"
    if folder.exists() or folder.is_symlink():
        RealNode(cluster).down(say)
