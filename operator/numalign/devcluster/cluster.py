"""A real Kubernetes control plane on loopback: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler built by :mod:`numalign.devcluster.build`,
with certificates generated on the spot and the numalign CRDs installed.

    cluster = DevCluster()                # ~/.cache/numalign/dev/default
    cluster.up(log=print)                 # idempotent: reuses a running one
    subprocess.run(["kubectl", "--kubeconfig", cluster.kubeconfig, "get", "nt"])
    cluster.down()                        # stops everything, removes the state

State dir layout: ``pki/`` (certificates), ``etcd/`` (data), ``logs/<component>.log``,
``run/<component>.pid``, ``kubeconfig`` (admin, group system:masters), a kubeconfig
per component, and ``state.json`` (ports, versions, machines). No kubelet runs: Node
objects come from the emulated-node agent (see :mod:`numalign.devcluster.addons`) or
from the test that needs them.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from ..api.kube import KubeConfig, SyncKube
from . import build, certs
from .addons import ADDONS, ClusterInfo, MachineSpec
from .crds import install_crds
from .processes import Process, free_ports
from .scheduler import CONFIG_FILE, write_scheduler_config

Log = Callable[[str], None]

SERVICE_CIDR = "10.96.0.0/16"
CLUSTER_CIDR = "10.244.0.0/16"
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
EXTENDER = "extender"  # numalign's scheduler extender, a process beside the addons
# Every default controller. The cloud ones (node lifecycle, service LB, routes) left
# kube-controller-manager for the cloud-controller-manager and are not known here.
CONTROLLERS = ("*",)
_STATE_FILES = ("kubeconfig", "controller-manager.kubeconfig", "scheduler.kubeconfig",
                "state.json", CONFIG_FILE)
_STATE_DIRS = ("pki", "etcd", "logs", "run", "operator", "realnode")


class DevClusterError(RuntimeError):
    """The control plane could not be started; the message says what to do next."""


def default_state_dir(name: str = "default") -> Path:
    return build.cache_root() / "dev" / name


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
        log: Log | None = None,
        timeout: float = 180.0,
        scheduler_extender: bool = True,
        extender: bool = False,
    ) -> DevCluster:
        """Start the control plane (or reuse the running one), install the CRDs and start
        the addons that apply. Raises DevClusterError (or build.BuildError).

        ``scheduler_extender``: kube-scheduler is configured with numalign's scheduler
        extender (ignorable: while it does not run, pods schedule without it);
        ``extender``: also run it (:meth:`start_extender`)."""
        say = log or _quiet
        machines = tuple(machines)
        self._want_extender = scheduler_extender
        t0 = time.monotonic()
        bins = build.ensure_built(log=say)
        say(f"binaries ready in {bins} ({time.monotonic() - t0:.1f}s)")
        if self.is_running():
            say(f"control plane already running at {self.server} (state {self.state_dir})")
            if install:
                self._install(say)
            self._start_addons(machines, operator, say, reuse=True)
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
            self._start(bins, say, timeout)
            if install:
                self._install(say)
            self._start_addons(machines, operator, say)
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

    def _close_kube(self) -> None:
        kube, self._kube = self._kube, None
        if kube is not None:
            kube.close()

    # -------------------------------------------------------------------- starting

    def _start(self, bins: Path, say: Log, timeout: float) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        t = time.monotonic()
        certs.generate(self.pki.dir)
        etcd_port, peer_port, api_port, kcm_port, sched_port, ext_port = free_ports(6)
        server = f"https://127.0.0.1:{api_port}"
        self._write_kubeconfigs(server)
        self._save_state({
            **({"extender": {"port": ext_port, "url": f"http://127.0.0.1:{ext_port}"}}
               if self._want_extender else {}),
            "name": self.name,
            "server": server,
            "ports": {"etcd": etcd_port, "etcdPeer": peer_port, "apiserver": api_port,
                      "controllerManager": kcm_port, "scheduler": sched_port},
            "kubernetesVersion": build.KUBERNETES_VERSION,
            "etcdVersion": build.ETCD_VERSION,
            "bin": str(bins),
        })
        say(f"certificates and kubeconfigs written ({time.monotonic() - t:.1f}s)")
        deadline = time.monotonic() + timeout

        t = time.monotonic()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self.process("etcd").start([
            str(bins / "etcd"),
            "--name=dev",
            f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=dev={peer_url}",
            "--unsafe-no-fsync",  # a throwaway dev store: no fsync, much faster on slow disks
            "--log-level=warn",
        ])
        # The API server waits for etcd by itself: start both, then wait for both.
        self.process("kube-apiserver").start(self._apiserver_args(bins, api_port, etcd_url))
        with _probe(etcd_url) as etcd:
            self._wait("etcd", lambda: etcd.ok("/health"), deadline, ("etcd",))
        say(f"etcd ready ({time.monotonic() - t:.1f}s)")
        admin = self.kube()
        self._wait("kube-apiserver /readyz", lambda: admin.ok("/readyz"), deadline,
                   ("etcd", "kube-apiserver"))
        say(f"kube-apiserver ready at {server} ({time.monotonic() - t:.1f}s)")

        t = time.monotonic()
        self.process("kube-controller-manager").start(self._controller_manager_args(bins, kcm_port))
        self.process("kube-scheduler").start(self._scheduler_args(bins, sched_port))
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

    def _apiserver_args(self, bins: Path, port: int, etcd_url: str) -> list[str]:
        p = self.pki
        return [
            str(bins / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={p.dir}",
            f"--tls-cert-file={p.apiserver.cert}",
            f"--tls-private-key-file={p.apiserver.key}",
            f"--client-ca-file={p.ca.cert}",
            "--authorization-mode=Node,RBAC",  # Node: a real kubelet's own rights
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p.sa_pub}",
            f"--service-account-signing-key-file={p.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
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
            "--endpoint-reconciler-type=none",  # loopback is no valid endpoint address
            "--profiling=false",
            "--v=1",
        ]

    def _component_args(self, binary: Path, kubeconfig: Path, port: int) -> list[str]:
        """What kube-controller-manager and kube-scheduler share: one kubeconfig for
        everything, a loopback secure port, no leader election."""
        return [
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.state_dir / 'run'}",
            "--leader-elect=false",
        ]

    def _controller_manager_args(self, bins: Path, port: int) -> list[str]:
        p = self.pki
        kc = self.state_dir / "controller-manager.kubeconfig"
        return [
            *self._component_args(bins / "kube-controller-manager", kc, port),
            "--controllers=" + ",".join(CONTROLLERS),
            f"--service-account-private-key-file={p.sa_key}",
            f"--root-ca-file={p.ca.cert}",
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={p.ca.cert}",
            f"--cluster-signing-key-file={p.ca.key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--cluster-cidr={CLUSTER_CIDR}",
            "--allocate-node-cidrs=false",
            *client_qps_flags(),
            "--profiling=false",
            "--v=1",
        ]

    def _scheduler_args(self, bins: Path, port: int) -> list[str]:
        kc = self.state_dir / "scheduler.kubeconfig"
        config = write_scheduler_config(self.state_dir, kc, client_qps_flags(),
                                        self.extender_url)
        return [
            *self._component_args(bins / "kube-scheduler", kc, port),
            f"--config={config}",
            "--v=1",
        ]

    # -------------------------------------------------------------------- extender

    @property
    def extender_url(self) -> str | None:
        """Where kube-scheduler calls numalign's extender (None: not configured)."""
        ext = self.state().get("extender")
        return str(ext["url"]) if isinstance(ext, dict) and ext.get("url") else None

    def start_extender(self, log: Log | None = None, timeout: float = 60.0) -> None:
        """Run ``numalign extender`` where the scheduler calls it; wait until ready."""
        say = log or _quiet
        url = self.extender_url
        if url is None:
            raise DevClusterError("this control plane's kube-scheduler has no extender "
                                  "(started with --no-extender): 'numalign dev down', then "
                                  "'numalign dev up' without --no-extender")
        proc = self.process(EXTENDER)
        if not proc.is_running():
            argv = ["-m", "numalign.cli", "extender", "--kubeconfig", str(self.kubeconfig),
                    "--addr", "127.0.0.1", "--port", url.rsplit(":", 1)[1]]
            proc.start([sys.executable, *argv], cwd=self.state_dir, program="numalign.cli",
                       env=dict(os.environ, KUBECONFIG=str(self.kubeconfig)))
            st = self.state()
            st["addons"] = {**st.get("addons", {}), EXTENDER: argv}
            self._save_state(st)
        t = time.monotonic()
        with _probe(url) as probe:
            self._wait("numalign extender /readyz", lambda: probe.ok("/readyz"),
                       time.monotonic() + timeout, (EXTENDER,))
        say(f"numalign extender ready at {url} ({time.monotonic() - t:.1f}s)")

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

    def _install(self, say: Log) -> None:
        t = time.monotonic()
        names = self.install_crds()
        say(f"CRDs established: {', '.join(names)} ({time.monotonic() - t:.1f}s)")

    # -------------------------------------------------------------------- addons

    def _start_addons(self, machines: tuple[MachineSpec, ...], operator: bool, say: Log,
                      reuse: bool = False) -> None:
        if reuse and not machines:
            machines = tuple(MachineSpec(Path(m["path"]), int(m["count"]))
                             for m in self.state().get("machines", []))
        info = ClusterInfo(name=self.name, state_dir=self.state_dir, kubeconfig=self.kubeconfig,
                           server=self.server or "", machines=machines, operator=operator)
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
            st["addons"] = {**st.get("addons", {}), **commands}
            self._save_state(st)
        if started:
            say(f"started {', '.join(started)} (logs in {self.state_dir / 'logs'})")
        if "agent" in started:
            self._wait_for_nodes(sum(m.count for m in machines), say)

    def _wait_for_nodes(self, count: int, say: Log, timeout: float = 120.0) -> None:
        """Wait until ``count`` Nodes are Ready (the emulated nodes registered)."""
        t = time.monotonic()
        kube = self.kube()

        def ready() -> bool:
            body = kube.get_quiet("/api/v1/nodes")
            if body is None:
                return False
            n = sum(1 for node in body.get("items", [])
                    if any(c.get("type") == "Ready" and c.get("status") == "True"
                           for c in (node.get("status") or {}).get("conditions") or []))
            return n >= count

        self._wait(f"{count} emulated nodes to be Ready", ready, time.monotonic() + timeout,
                   ("kube-apiserver", "agent"))
        say(f"{count} emulated node(s) Ready ({time.monotonic() - t:.1f}s)")

    # -------------------------------------------------------------------- stopping

    def _stop_all(self, say: Log = _quiet) -> None:
        """The real node first, then the addons (all at once, SIGKILL after 5s), then the
        control plane in reverse start order."""
        if (self.state_dir / "realnode").exists():
            from .realnode import RealNode  # it builds on this module

            RealNode(self).down(say)
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
        ):
            write_kubeconfig(path, ctx, server, p.ca.cert, pair.cert, pair.key, user)


def _probe(url: str) -> SyncKube:
    """A client for a component's health endpoint (its serving certificate unverified)."""
    return SyncKube(KubeConfig.from_files(url, None), max_connections=1,
                    user_agent="numalign-dev")


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, name: str, server: str, ca: Path, cert: Path, key: Path,
                     user: str) -> None:
    """A self-contained kubeconfig (certificates embedded), mode 0600."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server,
                                                "certificate-authority-data": _b64(ca)}}],
        "users": [{"name": user, "user": {"client-certificate-data": _b64(cert),
                                          "client-key-data": _b64(key)}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": user}}],
        "current-context": name,
        "preferences": {},
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
