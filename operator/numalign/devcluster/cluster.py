"""A real Kubernetes control plane on loopback: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler built by :mod:`numalign.devcluster.build`,
with certificates generated on the spot and the numalign CRDs installed.

    cluster = DevCluster()                # ~/.cache/numalign/dev/default
    cluster.up(log=print)                 # idempotent: reuses a running one
    subprocess.run(["kubectl", "--kubeconfig", cluster.kubeconfig, "get", "nt"])
    cluster.down()                        # stops everything, removes the state

State dir layout: ``pki/`` (certificates, :mod:`.certs`), ``etcd/`` (data),
``logs/<component>.log``, ``run/<component>.pid``, ``kubeconfig`` (admin, group
system:masters), a kubeconfig per component, and ``state.json`` (ports, versions,
machines). No kubelet runs: Node objects come from the emulated-node agent (see
:mod:`numalign.devcluster.addons`) or from the test that needs them.

etcd answers only the API server's client certificate (:mod:`.components`); the
scheduler extender's verbs answer only kube-scheduler's, and it acts with its own RBAC
(:mod:`.extender_host`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..api.kube import NT_BASE, ApiError, KubeConfig, SyncKube
from . import build, certs
from .addons import ADDONS, ClusterInfo, MachineSpec, metrics_url
from .components import (
    apiserver_args,
    controller_manager_args,
    etcd_args,
    etcd_client,
    etcd_url,
    scheduler_args,
)
from .crds import install_crds
from .dra import install_device_classes
from .extender_host import EXTENDER, Endpoints, extender_argv, install_rbac, scheduler_tls
from .extender_host import KUBECONFIG as EXTENDER_KUBECONFIG
from .hostcgroups import add_host_address, remove_host_address
from .kubeconfigs import write_kubeconfig as write_kubeconfig
from .policies import PolicyError, install_policies
from .processes import Process, free_ports
from .scheduler import CONFIG_FILE, write_scheduler_config

Log = Callable[[str], None]

SERVICE_CIDR = "10.96.0.0/16"
CLUSTER_CIDR = "10.244.0.0/16"
# Where the API server listens when pods must reach it (``up(in_cluster=True)``): a private
# address of this host, on its loopback device, in the cluster's pod range but outside any
# node's pod subnet. Pods reach it through the ``kubernetes`` Service (kube-proxy on the
# real node), whose endpoint it is; it is never an address of an external interface.
HOST_ADDRESS = "10.244.255.1"
# API client rate limits of kube-controller-manager and kube-scheduler. Raised above the
# Kubernetes defaults (20 and 50 QPS) so that a dev cluster on loopback creates and binds
# Deployments' pods in bursts; NUMALIGN_DEV_CLIENT_QPS=default keeps the Kubernetes
# defaults (pods then arrive at a production cluster's pace), QPS/BURST sets both.
DEFAULT_CLIENT_QPS = "200/400"


def client_qps_flags(value: str | None = None) -> tuple[str, ...]:
    """The ``--kube-api-qps``/``--kube-api-burst`` flags for ``NUMALIGN_DEV_CLIENT_QPS``."""
    raw = (value if value is not None
           else os.environ.get("NUMALIGN_DEV_CLIENT_QPS", DEFAULT_CLIENT_QPS)).strip()
    if raw == "default":
        return ()
    qps, _, burst = raw.partition("/")
    if not qps.isdigit() or not (burst or qps).isdigit() or int(qps) == 0:
        raise DevClusterError(f"NUMALIGN_DEV_CLIENT_QPS={raw!r}: expected 'default' or "
                              "QPS/BURST in whole numbers, e.g. 200/400")
    return (f"--kube-api-qps={qps}", f"--kube-api-burst={burst or qps}")
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
# Every default controller. The cloud ones (node lifecycle, service LB, routes) left
# kube-controller-manager for the cloud-controller-manager and are not known here.
CONTROLLERS = ("*",)
_STATE_FILES = ("kubeconfig", "controller-manager.kubeconfig", "scheduler.kubeconfig",
                EXTENDER_KUBECONFIG, "state.json", CONFIG_FILE)
_STATE_DIRS = ("pki", "etcd", "logs", "run", "operator", "realnode")


class DevClusterError(RuntimeError):
    """The control plane could not be started; the message says what to do next."""


def default_state_dir(name: str = "default") -> Path:
    return build.cache_root() / "dev" / name


# What builds on the cluster and must stop before it (the real node, devcluster/realnode.py):
# each registers, when its module is imported (the package imports them all), a function
# that stops its part from what is on disk alone. The cluster does not import them.
Teardown = Callable[["DevCluster", Log], None]
_TEARDOWNS: list[Teardown] = []


def on_down(fn: Teardown) -> Teardown:
    """Register ``fn`` to run first when a cluster stops (``DevCluster.down``)."""
    _TEARDOWNS.append(fn)
    return fn


def _quiet(_msg: str) -> None:
    pass


class DevCluster:
    def __init__(self, state_dir: Path | str | None = None, name: str | None = None,
                 ephemeral: bool = False) -> None:
        """``ephemeral`` (tests): the processes die with the Python process that started
        them (Linux), so an aborted test run leaves no control plane behind. Call up()
        from the main thread then: the kernel signals when the starting thread ends."""
        self.state_dir = Path(state_dir).expanduser() if state_dir else default_state_dir(
            name or "default")
        self.name = name or self.state_dir.name
        self.ephemeral = ephemeral
        self.pki = certs.Pki.at(self.state_dir / "pki")
        self.addons = list(ADDONS)
        self._procs: dict[str, Process] = {}
        self._kube: SyncKube | None = None
        self._want_extender = True
        self.apiserver_flags: list[str] = []  # more kube-apiserver flags (an audit log...)

    # -------------------------------------------------------------------- public API

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (user in group system:masters)."""
        return self.state_dir / "kubeconfig"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    def state(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.state_file.read_text())
            return data
        except (OSError, ValueError):
            return {}

    @property
    def server(self) -> str | None:
        server = self.state().get("server")
        return str(server) if server else None

    def process(self, name: str) -> Process:
        if name not in self._procs:
            self._procs[name] = Process(name, self.state_dir / "run", self.state_dir / "logs",
                                        die_with_parent=self.ephemeral)
        return self._procs[name]

    def is_running(self) -> bool:
        """Every control-plane process runs and the API server is ready."""
        st = self.state()
        if not st.get("server") or not self.kubeconfig.is_file():
            return False
        if not all(self.process(n).is_running() for n in CONTROL_PLANE):
            return False
        return self.kube().ok("/readyz")

    def up(
        self,
        *,
        machines: Iterable[MachineSpec] = (),
        operator: bool = False,
        install: bool = True,
        in_cluster: bool = False,
        log: Log | None = None,
        timeout: float = 180.0,
        scheduler_extender: bool = True,
        extender: bool = False,
        dra: bool = False,
    ) -> DevCluster:
        """Start the control plane (or reuse the running one), install the CRDs and start
        the addons that apply. ``in_cluster``: numalign will be installed into the
        cluster as pods (``dev up --install``): the API server listens on
        :data:`HOST_ADDRESS`, which pods reach, and the dev cluster installs no admission
        policies of its own (the installation brings them). Raises DevClusterError (or
        build.BuildError).

        ``scheduler_extender``: kube-scheduler is configured with numalign's scheduler
        extender (ignorable: while it does not run, pods schedule without it);
        ``extender``: also run it (:meth:`start_extender`); ``dra``: the emulated nodes
        publish their devices as ResourceSlices (``dev up --dra``), with DeviceClasses."""
        say = log or _quiet
        machines = tuple(machines)
        self._want_extender = scheduler_extender
        t0 = time.monotonic()
        bins = build.ensure_built(log=say)
        say(f"binaries ready in {bins} ({time.monotonic() - t0:.1f}s)")
        if self.is_running():
            say(f"control plane already running at {self.server} (state {self.state_dir})")
            if in_cluster != bool(self.state().get("hostAddress")):
                raise DevClusterError(
                    "the running control plane listens on "
                    f"{'a pod-reachable address' if not in_cluster else 'loopback only'}; "
                    "'numalign dev down' first to start it "
                    f"{'for' if in_cluster else 'without'} an installed numalign")
            if install:
                self._install(say, policies=not in_cluster)
            self._start_addons(machines, operator, say, reuse=True, dra=dra)
            if extender and self.extender_url is None:
                say("the running kube-scheduler has no extender (started with "
                    "--no-extender): numalign extender not started")
            elif extender:
                self.start_extender(say)
            return self
        if any(self.process(n).pid is not None for n in CONTROL_PLANE):
            say("a previous control plane is partly running: stopping it and starting afresh")
        self._stop_all()
        self._clean()
        try:
            self._start(bins, say, timeout, HOST_ADDRESS if in_cluster else None)
            if install:
                self._install(say, policies=not in_cluster)
            self._start_addons(machines, operator, say, dra=dra)
            if extender:
                self.start_extender(say)
        except BaseException:
            self._stop_all()
            raise
        say(f"control plane up in {time.monotonic() - t0:.1f}s; "
            f"export KUBECONFIG={self.kubeconfig}")
        return self

    def down(self, log: Log | None = None) -> bool:
        """Stop every process and remove the state; False when nothing was there."""
        say = log or _quiet
        existed = self.state_dir.is_dir() and any(
            (self.state_dir / p).exists() for p in (*_STATE_FILES, *_STATE_DIRS))
        t0 = time.monotonic()
        self._stop_all(say)
        self._clean()
        with contextlib.suppress(OSError):
            self.state_dir.rmdir()  # only when empty: never removes what we did not write
        if existed:
            say(f"control plane stopped and state removed ({time.monotonic() - t0:.1f}s)")
        return existed

    def install_crds(self, crd_dir: Path | None = None, log: Log | None = None) -> list[str]:
        """Install (create or update) the CRDs and wait until they are Established.
        ``crd_dir``: YAML files to apply; default: the ones generated from the models."""
        return install_crds(self.kube(), crd_dir, log=log or _quiet)

    def processes(self) -> dict[str, bool]:
        """Every component with a pid file (control plane, then addons): running or not."""
        names = [*CONTROL_PLANE, *(a.name for a in self.addons), EXTENDER]
        return {n: self.process(n).is_running() for n in names
                if self.process(n).pid is not None}

    def log_file(self, component: str) -> Path:
        return self.process(component).log_file

    def metrics_url(self, component: str) -> str | None:
        """Where ``component`` serves Prometheus metrics (the control plane's need the
        admin credentials of the kubeconfig, etcd's its client certificate
        ``pki/apiserver-etcd-client.crt``; numalign's, the extender's probe port included,
        are plain HTTP)."""
        st = self.state()
        ports = st.get("ports") or {}
        if component == EXTENDER:
            probe = self.extender_probe_url
            return f"{probe}/metrics" if probe else None
        plane = {"etcd": ("https", ports.get("etcd")),
                 "kube-apiserver": ("https", ports.get("apiserver")),
                 "kube-controller-manager": ("https", ports.get("controllerManager")),
                 "kube-scheduler": ("https", ports.get("scheduler"))}
        if component in plane:
            scheme, port = plane[component]
            return f"{scheme}://127.0.0.1:{port}/metrics" if port else None
        return metrics_url((st.get("addons") or {}).get(component))

    def kube(self) -> SyncKube:
        """The API client (synchronous facade) as the admin user; one per cluster
        address, closed by :meth:`down`."""
        server = self.server or "https://127.0.0.1:0"
        if self._kube is not None and self._kube.config.host != server.rstrip("/"):
            self._close_kube()
        if self._kube is None:
            self._kube = SyncKube(KubeConfig.from_files(
                server, self.pki.ca.cert, self.pki.admin.cert, self.pki.admin.key),
                user_agent="numalign-dev")
        return self._kube

    def close(self) -> None:
        """Close the API client (its connection pool and loop thread; the cluster keeps
        running); a later call opens a new one."""
        self._close_kube()

    def _close_kube(self) -> None:
        kube, self._kube = self._kube, None
        if kube is not None:
            kube.close()

    # -------------------------------------------------------------------- starting

    def _start(self, bins: Path, say: Log, timeout: float, address: str | None) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        t = time.monotonic()
        if address is not None:
            try:
                add_host_address(address)
            except OSError as e:
                raise DevClusterError(f"the API server's pod-reachable address: {e} "
                                      "(needs root)") from None
        certs.generate(self.pki.dir, (address,) if address else ())
        etcd_port, peer_port, api_port, kcm_port, sched_port, ext_port, probe_port = (
            free_ports(7))
        server = f"https://{address or '127.0.0.1'}:{api_port}"
        self._write_kubeconfigs(server)
        self._save_state({
            **({"extender": Endpoints(ext_port, probe_port).to_state()}
               if self._want_extender else {}),
            "name": self.name,
            "server": server,
            **({"hostAddress": address} if address else {}),
            "ports": {"etcd": etcd_port, "etcdPeer": peer_port, "apiserver": api_port,
                      "controllerManager": kcm_port, "scheduler": sched_port},
            "kubernetesVersion": build.KUBERNETES_VERSION,
            "etcdVersion": build.ETCD_VERSION,
            "bin": str(bins),
        })
        say(f"certificates and kubeconfigs written ({time.monotonic() - t:.1f}s)")
        deadline = time.monotonic() + timeout

        t = time.monotonic()
        p = self.pki
        self.process("etcd").start(etcd_args(bins, p, self.state_dir / "etcd", etcd_port,
                                             peer_port))
        # The API server waits for etcd by itself: start both, then wait for both.
        self.process("kube-apiserver").start([*apiserver_args(
            bins, p, api_port, etcd_url(etcd_port), SERVICE_CIDR, address),
            *self.apiserver_flags])
        with etcd_client(p, etcd_port) as etcd:
            self._wait("etcd", lambda: etcd.ok("/health"), deadline, ("etcd",))
        say(f"etcd ready ({time.monotonic() - t:.1f}s)")
        admin = self.kube()
        self._wait("kube-apiserver /readyz", lambda: admin.ok("/readyz"), deadline,
                   ("etcd", "kube-apiserver"))
        say(f"kube-apiserver ready at {server} ({time.monotonic() - t:.1f}s)")

        t = time.monotonic()
        run = self.state_dir / "run"
        self.process("kube-controller-manager").start(controller_manager_args(
            bins, p, self.state_dir / "controller-manager.kubeconfig", kcm_port, run,
            controllers=CONTROLLERS, service_cidr=SERVICE_CIDR, cluster_cidr=CLUSTER_CIDR,
            qps_flags=client_qps_flags()))
        kc = self.state_dir / "scheduler.kubeconfig"
        url = self.extender_url
        config = write_scheduler_config(self.state_dir, kc, client_qps_flags(), url,
                                        scheduler_tls(p) if url else None)
        self.process("kube-scheduler").start(scheduler_args(bins, kc, sched_port, run, config))
        with _probe(f"https://127.0.0.1:{sched_port}") as sched:
            self._wait("kube-scheduler /healthz", lambda: sched.ok("/healthz"), deadline,
                       CONTROL_PLANE)
        with _probe(f"https://127.0.0.1:{kcm_port}") as kcm:
            self._wait("kube-controller-manager /healthz", lambda: kcm.ok("/healthz"),
                       deadline, CONTROL_PLANE)
        self._wait("the default service account",
                   lambda: admin.ok("/api/v1/namespaces/default/serviceaccounts/default"),
                   deadline, CONTROL_PLANE)
        say(f"kube-controller-manager and kube-scheduler ready ({time.monotonic() - t:.1f}s)")

    # -------------------------------------------------------------------- extender

    def _extender(self, key: str) -> str | None:
        ext = self.state().get("extender")
        return str(ext[key]) if isinstance(ext, dict) and ext.get(key) else None

    @property
    def extender_url(self) -> str | None:
        """Where kube-scheduler calls numalign's extender, HTTPS with its client
        certificate (None: not configured)."""
        return self._extender("url")

    @property
    def extender_probe_url(self) -> str | None:
        """The extender's probe port, plain HTTP: ``/healthz``, ``/readyz``, ``/metrics``
        (None: not configured)."""
        return self._extender("probeUrl")

    @property
    def extender_kubeconfig(self) -> Path:
        """The extender's own kubeconfig (user ``numalign-extender``: its RBAC only)."""
        return self.state_dir / EXTENDER_KUBECONFIG

    def start_extender(self, log: Log | None = None, timeout: float = 60.0) -> None:
        """Run ``numalign extender`` where the scheduler calls it; wait until ready."""
        say = log or _quiet
        ext = self.state().get("extender")
        if not isinstance(ext, dict) or not ext.get("url"):
            raise DevClusterError("this control plane's kube-scheduler has no extender "
                                  "(started with --no-extender): 'numalign dev down', then "
                                  "'numalign dev up' without --no-extender")
        if not str(ext["url"]).startswith("https:") or not ext.get("probePort"):
            raise DevClusterError("this control plane's kube-scheduler calls the extender "
                                  "over plain HTTP (started by an older numalign): "
                                  "'numalign dev down', then 'numalign dev up'")
        endpoints = Endpoints(int(ext["port"]), int(ext["probePort"]))
        proc = self.process(EXTENDER)
        if not proc.is_running():
            try:
                install_rbac(self.kube())
            except (OSError, ValueError, ApiError) as e:
                raise DevClusterError(f"the extender's RBAC: {e}") from e
            argv = extender_argv(self.pki, self.extender_kubeconfig, endpoints)
            proc.start([sys.executable, *argv], cwd=self.state_dir, program="numalign.cli",
                       env=dict(os.environ, KUBECONFIG=str(self.extender_kubeconfig)))
            st = self.state()
            st["addons"] = {**st.get("addons", {}), EXTENDER: argv}
            self._save_state(st)
        t = time.monotonic()
        with _probe(endpoints.probe_url) as probe:
            self._wait("numalign extender /readyz", lambda: probe.ok("/readyz"),
                       time.monotonic() + timeout, (EXTENDER,))
        say(f"numalign extender ready at {endpoints.url} ({time.monotonic() - t:.1f}s)")

    def stop_extender(self, timeout: float = 5.0) -> None:
        """Stop the extender (the scheduler goes on without it: it is ignorable)."""
        self.process(EXTENDER).stop(timeout)

    def _wait(self, what: str, ready: Callable[[], bool], deadline: float,
              components: Iterable[str]) -> None:
        components = tuple(components)
        while True:
            if ready():
                return
            for name in components:
                proc = self.process(name)
                if not proc.is_running():
                    raise DevClusterError(
                        f"{name} exited while waiting for {what}; its log "
                        f"({proc.log_file}) ends with:\n{proc.log_tail()}\n"
                        "Fix the cause (a port taken, a bad binary: 'numalign dev build') "
                        "and run 'numalign dev up' again."
                    )
            if time.monotonic() > deadline:
                logs = ", ".join(str(self.process(n).log_file) for n in components)
                raise DevClusterError(
                    f"timed out waiting for {what}; see the logs ({logs}). "
                    "On a loaded machine, retry with a longer --timeout."
                )
            time.sleep(0.2)

    def _install(self, say: Log, policies: bool = True) -> None:
        t = time.monotonic()
        names = self.install_crds()
        say(f"CRDs established: {', '.join(names)} ({time.monotonic() - t:.1f}s)")
        if not policies:
            return
        try:
            names = install_policies(self.kube())
        except PolicyError as e:
            raise DevClusterError(str(e)) from e
        say(f"admission policies installed: {', '.join(names)}")

    # -------------------------------------------------------------------- addons

    def _start_addons(self, machines: tuple[MachineSpec, ...], operator: bool, say: Log,
                      reuse: bool = False, dra: bool = False) -> None:
        if reuse and not machines:
            machines = tuple(MachineSpec(Path(m["path"]), int(m["count"]))
                             for m in self.state().get("machines", []))
            dra = dra or bool(self.state().get("dra"))
        info = ClusterInfo(name=self.name, state_dir=self.state_dir, kubeconfig=self.kubeconfig,
                           server=self.server or "", machines=machines, operator=operator,
                           dra=dra)
        if dra and machines:
            install_device_classes(self.kube(), (m.path for m in machines), say)
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        started: list[str] = []
        commands: dict[str, list[str]] = {}
        for addon in self.addons:
            argv = addon.argv(info)
            if argv is None:
                continue
            if not addon.available():
                if addon.name == "agent":
                    say(f"emulated nodes asked for but {addon.module} is not available: "
                        "no nodes will register (nodes need the agent)")
                else:
                    say(f"{addon.name}: {addon.module} is not available; not started")
                continue
            proc = self.process(addon.name)
            if proc.is_running():
                continue
            proc.start([sys.executable, *argv], env=env, cwd=self.state_dir,
                       program=argv[1] if argv[:1] == ["-m"] else None)
            started.append(addon.name)
            commands[addon.name] = argv
        if machines or commands:
            st = self.state()
            if machines:
                st["machines"] = [{"path": str(m.path), "count": m.count} for m in machines]
                if dra:
                    st["dra"] = True
            st["addons"] = {**st.get("addons", {}), **commands}
            self._save_state(st)
        if started:
            say(f"started {', '.join(started)} (logs in {self.state_dir / 'logs'})")
        if "agent" in started:
            self._wait_for_nodes(sum(m.count for m in machines), say)

    def _wait_for_nodes(self, count: int, say: Log, timeout: float = 120.0) -> None:
        """Wait until ``count`` Nodes are Ready (the emulated nodes registered) and every
        Ready Node's NodeTopology has its agent's status (``kubectl get nt`` lists them)."""
        t = time.monotonic()
        kube = self.kube()

        def ready() -> bool:
            body = kube.get_quiet("/api/v1/nodes")
            if body is None:
                return False
            names = [str((node.get("metadata") or {}).get("name"))
                     for node in body.get("items", [])
                     if any(c.get("type") == "Ready" and c.get("status") == "True"
                            for c in (node.get("status") or {}).get("conditions") or [])]
            if len(names) < count:
                return False
            nts = kube.get_quiet(NT_BASE)
            published = {str((nt.get("metadata") or {}).get("name"))
                         for nt in (nts or {}).get("items", [])
                         if (nt.get("status") or {}).get("zones")}
            return all(n in published for n in names)

        self._wait(f"{count} emulated nodes to be Ready with their NodeTopology", ready,
                   time.monotonic() + timeout, ("kube-apiserver", "agent"))
        say(f"{count} emulated node(s) Ready, NodeTopologies published "
            f"({time.monotonic() - t:.1f}s)")

    # -------------------------------------------------------------------- stopping

    def _stop_all(self, say: Log = _quiet) -> None:
        """The real node first, then the addons (all at once, SIGKILL after 5s), then the
        control plane in reverse start order."""
        for teardown in _TEARDOWNS:
            teardown(self, say)
        addons = [self.process(n) for n in (EXTENDER, *(a.name for a in reversed(self.addons)))]
        plane = [self.process(n) for n in reversed(CONTROL_PLANE)]
        running = {p.name for p in (*addons, *plane) if p.is_running()}
        for proc in addons:
            proc.terminate()
        for proc, timeout in [*((a, 5.0) for a in addons), *((p, 10.0) for p in plane)]:
            if proc.pid is not None:
                proc.stop(timeout)
                if proc.name in running:
                    say(f"stopped {proc.name}")
        if self.state().get("hostAddress"):
            remove_host_address(HOST_ADDRESS)  # never an address state.json names

    def _clean(self) -> None:
        """Remove what up() wrote (and nothing else) from the state dir."""
        self._close_kube()  # its credentials go with the state
        for f in _STATE_FILES:
            (self.state_dir / f).unlink(missing_ok=True)
        for d in _STATE_DIRS:
            shutil.rmtree(self.state_dir / d, ignore_errors=True)

    # -------------------------------------------------------------------- files

    def _save_state(self, data: dict[str, Any]) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(self.state_file)

    def _write_kubeconfigs(self, server: str) -> None:
        p = self.pki
        ctx = f"numalign-{self.name}"
        for path, pair, user in (
            (self.kubeconfig, p.admin, "admin"),
            (self.state_dir / "controller-manager.kubeconfig", p.controller_manager,
             "system:kube-controller-manager"),
            (self.state_dir / "scheduler.kubeconfig", p.scheduler, "system:kube-scheduler"),
            (self.extender_kubeconfig, p.extender_client, certs.EXTENDER_USER),
        ):
            write_kubeconfig(path, ctx, server, p.ca.cert, pair.cert, pair.key, user)


def _probe(url: str) -> SyncKube:
    """A client for a component's health endpoint (its serving certificate unverified)."""
    return SyncKube(KubeConfig.from_files(url, None), max_connections=1,
                    user_agent="numalign-dev")
