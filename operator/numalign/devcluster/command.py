"""``numalign dev``: the local control plane for the demo and the tests.

    numalign dev build [--real-node]         # build (or find cached) the binaries
                                             # (the control plane, the kubelet oracle, helm)
    numalign dev up [--machine FILE[=COUNT]]... [--state-dir DIR]
    numalign dev up --demo [--state-dir DIR]  # + emulated nodes and the sample workloads
    numalign dev up --real-node [FILE]       # + a real kubelet and containerd (root)
    numalign dev up --real-node --nri        # ... numalign-managed: it places containers (NRI)
    numalign dev up --real-node [--nri] --install kustomize|helm   # numalign as pods
    numalign dev kubeconfig                  # print the kubeconfig path
    numalign dev status
    numalign dev down
    numalign dev device-plugin --machine FILE --kubelet-dir DIR   # the real node's devices
    numalign dev dra-plugin --machine FILE --kubelet-dir DIR --cdi-dir DIR   # ... through DRA
    numalign dev image [--out DIR] [--import]  # numalign.local/numalign:dev, no registry
    numalign dev image --update-lock           # re-pin the image's Python dependencies
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from ..topology.errors import MachineError
from ..topology.text import printable
from .addons import MachineSpec, MachineSpecError
from .build import BuildError, ensure_built
from .cluster import DevCluster, DevClusterError, default_state_dir
from .crds import CrdError
from .demo import REPO, SAMPLES, Demo, DemoResult, Kubectl, pods_of, story
from .helmbuild import ensure_helm_built
from .images.numalign_image import (
    IMAGE,
    LOCK,
    build_image,
    repo_root,
    update_lock,
)
from .images.oci import ImageError
from .install import METHODS, Installer
from .nodebuild import ensure_node_built
from .oracle_build import ensure_oracle_built
from .realnode import PROCESSES, RealNode, cannot_run_containers
from .realnode_config import MODE_KUBELET, MODE_NRI

REAL_NODE_MACHINE = SAMPLES / "realnode" / "realnode-2numa.yaml"

DESCRIPTION = """\
A real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler) on 127.0.0.1, built from source with the local Go toolchain and cached
under ~/.cache/numalign (override with NUMALIGN_CACHE). No kubelet runs: nodes are
emulated by the numalign agent (--machine), which plays the kubelet's part for the
pods bound to them; without it pods stay Pending.
"""


def _log(message: str) -> None:
    print(f"numalign dev: {printable(message)}", file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="numalign dev", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="action", metavar="ACTION")

    def with_state(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--state-dir", type=Path, default=None, metavar="DIR",
                       help=f"where certificates, data, logs and the kubeconfig live "
                            f"(default: {default_state_dir('NAME')})")
        p.add_argument("--name", default="default",
                       help="cluster name, for several side by side (default: default)")
        return p

    up = with_state(sub.add_parser(
        "up", help="start the control plane (or reuse the running one) and install the CRDs",
        description="Start the control plane, or reuse it when it already runs; install "
                    "the CRDs; start the operator and emulated nodes where available."))
    up.add_argument("--machine", action="append", default=[], metavar="FILE[=COUNT]",
                    help="emulate COUNT nodes (default 1) with the hardware in machine file "
                         "FILE; repeatable. Nodes need the numalign agent "
                         "(numalign.agent.emulate): without it none register")
    up.add_argument("--real-node", nargs="?", const=REAL_NODE_MACHINE, default=None,
                    type=Path, metavar="FILE",
                    help="also run a real node: a kubelet and containerd built from source "
                         "(numalign dev build --real-node), the kubelet seeing the NUMA "
                         "layout of machine file FILE mapped onto this machine's CPUs "
                         f"(default: {REAL_NODE_MACHINE.relative_to(REPO)}); needs root "
                         "and cgroups")
    up.add_argument("--topology-policy", default=None, metavar="POLICY",
                    help="with --real-node: the kubelet's Topology Manager policy (default: "
                         "the node's NodeTopology default, else single-numa-node)")
    up.add_argument("--dra", action="store_true",
                    help="the emulated nodes publish their machine files' devices as "
                         "ResourceSlices of the emulated DRA driver (emulated.numalign.io) "
                         "instead of extended resources; installs a DeviceClass per kind; "
                         "with --real-node the real node's devices come through a DRA "
                         "kubelet plugin (driver dra.numalign.io) instead of the sample "
                         "device plugin")
    up.add_argument("--nri", action="store_true",
                    help="with --real-node: numalign-managed -- the kubelet's CPU, memory and "
                         "Topology managers at none, the Node labelled numalign.io/managed=nri "
                         "and numalign's agent placing each container under its pod's "
                         "resolved policy through containerd's NRI socket")
    up.add_argument("--install", choices=METHODS, default=None,
                    help="with --real-node: install numalign into the cluster as a user "
                         "does, from config/default (kustomize) or charts/numalign (helm), "
                         f"with the image {IMAGE} imported into the real node: the operator "
                         "and the real node's agent run as pods (the API server listens on "
                         "an address pods reach; kube-proxy serves the Services)")
    up.add_argument("--no-operator", action="store_true",
                    help="do not start the numalign operator even when it is available")
    up.add_argument("--no-extender", action="store_true",
                    help="kube-scheduler without numalign's scheduler extender: pods are "
                         "placed by the default scheduler alone and nodes reject what does "
                         "not align (the operator redeploys them)")
    up.add_argument("--timeout", type=float, default=180.0, metavar="SECONDS",
                    help="how long to wait for the components (default 180)")
    up.add_argument("--demo", action="store_true",
                    help="also emulate the nodes of the machine files in "
                         "config/samples/machines, apply config/samples (TopologyPolicies "
                         "and workloads), wait until they settle and show the result; "
                         "again on a running cluster: reuses it, re-applies the samples")
    up.add_argument("--no-real-node", action="store_true",
                    help="with --demo: no real node (by default the demo adds one where "
                         "this machine can run containers: root and cgroups)")
    up.add_argument("--samples", type=Path, default=SAMPLES, metavar="DIR",
                    help="with --demo: the kustomization to apply, with a machines/ folder "
                         "(default: config/samples of this repository)")
    with_state(sub.add_parser("down", help="stop everything and remove the state"))
    with_state(sub.add_parser("kubeconfig", help="print the kubeconfig path "
                                                 "(export KUBECONFIG=$(numalign dev kubeconfig))"))
    with_state(sub.add_parser("status", help="say whether the control plane runs"))
    build = sub.add_parser("build", help="build the binaries, the kubelet oracle and helm "
                                         "the tests use (cached: instant when built)")
    build.add_argument("--real-node", action="store_true",
                       help="also build the real node's kubelet, containerd, runc and CNI "
                            "plugins (what 'dev up --real-node' runs)")
    image = with_state(sub.add_parser(
        "image", help=f"build the image {IMAGE} (operator and agent) from Debian's "
                      "packages and this checkout, no image registry needed",
        description=f"Build {IMAGE}: Debian's Python runtime (apt-get download), numalign's "
                    f"dependencies pinned in {LOCK} and this checkout's wheel, as an OCI "
                    "archive (layers cached under ~/.cache/numalign/image; a warm build "
                    "takes seconds). Prints the archive's path."))
    image.add_argument("--out", type=Path, default=None, metavar="DIR",
                       help="write the archive into DIR (default: ~/.cache/numalign/image)")
    image.add_argument("--import", dest="import_", action="store_true",
                       help="also import it into the running real node's containerd")
    image.add_argument("--update-lock", action="store_true",
                       help=f"resolve the dependencies again and rewrite {LOCK} (then build)")
    plugin = sub.add_parser(
        "device-plugin", help="serve a machine file's devices to a kubelet (device plugin API)",
        description="A sample device plugin (v1beta1): advertises the machine file's devices "
                    "(or one numalign.io/sample-device per NUMA node when it lists none) with "
                    "their NUMA node, registers with the kubelet and re-registers when the "
                    "kubelet restarts. Runs until SIGTERM or SIGINT.")
    plugin.add_argument("--machine", type=Path, required=True, metavar="FILE",
                        help="machine file whose devices to advertise")
    plugin.add_argument("--kubelet-dir", type=Path, required=True, metavar="DIR",
                        help="the kubelet's --root-dir (its registry socket is "
                             "DIR/device-plugins/kubelet.sock)")
    dra = sub.add_parser(
        "dra-plugin", help="serve a machine file's devices to a kubelet (DRA kubelet plugin)",
        description="A DRA kubelet plugin (driver dra.numalign.io): publishes the machine "
                    "file's devices as the node's ResourceSlices (with their NUMA node), "
                    "registers in the kubelet's plugins_registry/ and prepares the claims the "
                    "kubelet hands it as CDI specs in --cdi-dir. Uses KUBECONFIG. Runs until "
                    "SIGTERM or SIGINT.")
    dra.add_argument("--machine", type=Path, required=True, metavar="FILE",
                     help="machine file whose devices to publish")
    dra.add_argument("--kubelet-dir", type=Path, required=True, metavar="DIR",
                     help="the kubelet's --root-dir (the plugin's registration socket goes "
                          "in DIR/plugins_registry/)")
    dra.add_argument("--cdi-dir", type=Path, required=True, metavar="DIR",
                     help="where the container runtime reads CDI specs (cdi_spec_dirs)")
    dra.add_argument("--node", default="localhost", help="the node (default: localhost)")
    return parser


def _cluster(args: argparse.Namespace) -> DevCluster:
    return DevCluster(args.state_dir, name=None if args.state_dir else args.name)


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.action is None:
        parser.print_help()
        return 2
    try:
        return _run(args)
    except (BuildError, DevClusterError, CrdError, MachineSpecError, MachineError) as e:
        _log(f"error: {e}")
        return 1
    except KeyboardInterrupt:
        _log("interrupted")
        return 130


def _run(args: argparse.Namespace) -> int:
    if args.action == "build":
        t0 = time.monotonic()
        path = ensure_built(log=_log)
        _log(f"binaries in {path} ({time.monotonic() - t0:.1f}s)")
        oracle = ensure_oracle_built(log=_log)
        _log(f"kubelet oracle (the tests' reference) at {oracle}")
        _log(f"helm (the chart's tests) at {ensure_helm_built(log=_log)}")
        print(path)
        if args.real_node:
            t0 = time.monotonic()
            node = ensure_node_built(log=_log)
            _log(f"real node binaries in {node} ({time.monotonic() - t0:.1f}s)")
            print(node)
        return 0
    if args.action == "device-plugin":
        return _device_plugin(args)
    if args.action == "dra-plugin":
        return _dra_plugin(args)
    if args.action == "image":
        return _image(args)
    if args.action == "up" and args.nri:
        if args.real_node is None and (not args.demo or args.no_real_node):
            _log("error: --nri is a mode of the real node: add --real-node")
            return 2
        if args.topology_policy is not None:
            _log("error: --topology-policy sets the kubelet's Topology Manager, which --nri "
                 "leaves at none (each pod's TopologyPolicy decides): drop one of them")
            return 2
    if args.action == "up" and args.dra and args.demo:
        _log("error: --dra runs the emulated nodes (--machine) and the real node as DRA "
             "drivers; the demo does not take it yet")
        return 2
    cluster = _cluster(args)
    try:
        return _act(args, cluster)
    finally:
        cluster.close()  # its API client's connections: none left for the interpreter's exit


def _act(args: argparse.Namespace, cluster: DevCluster) -> int:
    if args.action == "up" and args.demo:
        return _demo(args, cluster)
    if args.action == "up":
        if args.install is not None and args.real_node is None:
            _log("error: --install runs numalign's pods on the real node: add --real-node")
            return 2
        machines = [MachineSpec.parse(m) for m in args.machine]
        t0 = time.monotonic()
        cluster.up(machines=machines, operator=not args.no_operator and args.install is None,
                   in_cluster=args.install is not None, log=_log, timeout=args.timeout,
                   scheduler_extender=not args.no_extender, extender=not args.no_extender,
                   dra=args.dra)
        if args.real_node is not None:
            real = _up_real_node(args, cluster, args.real_node)
            if args.install is not None:
                Installer(cluster, real, args.install).install(
                    log=_log, timeout=max(args.timeout, 300.0))
                _log(f"dev up --install {args.install}: every numalign pod Ready "
                     f"{time.monotonic() - t0:.1f}s after the start")
        cluster.close()
        print(cluster.kubeconfig)
        return 0
    if args.action == "down":
        if not cluster.down(log=_log):
            _log(f"nothing to stop in {cluster.state_dir}")
        return 0
    if args.action == "kubeconfig":
        if not cluster.kubeconfig.is_file():
            _log(f"no control plane in {cluster.state_dir}: run 'numalign dev up' first")
            return 1
        print(cluster.kubeconfig)
        return 0
    if args.action == "status":
        running = cluster.is_running()
        if running:
            print(f"running: {cluster.server} (kubeconfig {cluster.kubeconfig})")
        else:
            print(f"not running (state {cluster.state_dir})")
        for name, alive in cluster.processes().items():
            print(f"  {name:<24} {'running' if alive else 'stopped'}"
                  f"  log {cluster.log_file(name)}")
            _print_metrics(alive, cluster.metrics_url(name))
        real = RealNode(cluster)
        if real.state().get("name"):
            print(f"  real node {real.name}: {_mode_text(real.state())}")
        for name in PROCESSES:
            if real.process(name).pid is not None:
                alive = real.process(name).is_running()
                print(f"  {'real node ' + name:<24} {'running' if alive else 'stopped'}"
                      f"  log {real.log_file(name)}")
                _print_metrics(alive, real.metrics_url(name))
        return 0 if running else 1
    raise AssertionError(args.action)


def _image(args: argparse.Namespace) -> int:
    try:
        if args.update_lock:
            update_lock(repo_root(), _log)
        archive, _manifest = build_image(args.out, log=_log)
        if args.import_:
            real = RealNode(_cluster(args))
            if not real.is_running():
                _log("error: --import: no real node runs (numalign dev up --real-node)")
                return 1
            real.import_archive(archive)
            _log(f"{IMAGE} imported into the real node's containerd")
    except ImageError as e:
        _log(f"image: error: {e}")
        return 1
    print(archive)
    return 0


def _print_metrics(alive: bool, url: str | None) -> None:
    if alive and url:
        print(f"  {'':<24} metrics {url}")


def _mode_text(state: dict[str, object]) -> str:
    """The real node's mode as ``dev status`` prints it."""
    dra = "; devices through DRA (dra.numalign.io)" if state.get("dra") else ""
    if state.get("mode", MODE_KUBELET) == MODE_NRI:
        return ("mode nri (numalign-managed: the agent places containers through NRI; "
                f"the kubelet's CPU, memory and Topology managers are none){dra}")
    return (f"mode kubelet (the kubelet places containers: static CPU manager, Topology "
            f"Manager policy {state.get('policy')}, scope {state.get('scope')}){dra}")


def _device_plugin(args: argparse.Namespace) -> int:
    from ..topology.errors import MachineError
    from ..topology.machine import load_machine
    from .deviceplugin import DevicePluginError, run_device_plugin

    try:
        machine = load_machine(args.machine)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda _s, _f: stop.set())
        run_device_plugin(machine, args.kubelet_dir, stop, log=_log)
    except (MachineError, DevicePluginError, OSError) as e:
        _log(f"device-plugin: error: {e}")
        return 1
    return 0


def _dra_plugin(args: argparse.Namespace) -> int:
    from ..api.kube import SyncKube
    from ..api.kube.config import ConfigError, load_config
    from ..topology.machine import load_machine
    from .draplugin import DraPluginError, check, run_dra_plugin

    try:
        machine = load_machine(args.machine)
        check(machine, args.kubelet_dir)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda _s, _f: stop.set())
        with SyncKube(load_config(), user_agent="numalign-dra-plugin") as kube:
            run_dra_plugin(machine, args.node, args.kubelet_dir, args.cdi_dir, kube, stop,
                           log=_log)
    except (MachineError, DraPluginError, ConfigError, OSError) as e:
        _log(f"dra-plugin: error: {e}")
        return 1
    return 0


def _cluster_flags(args: argparse.Namespace) -> str:
    if args.state_dir:
        return f" --state-dir {shlex.quote(str(args.state_dir))}"
    return f" --name {shlex.quote(args.name)}" if args.name != "default" else ""


def _demo(args: argparse.Namespace, cluster: DevCluster) -> int:
    if args.no_operator:
        _log("error: --demo needs the operator: drop --no-operator")
        return 2
    t0 = time.monotonic()
    extra = [MachineSpec.parse(m) for m in args.machine]
    result = Demo(cluster, samples=args.samples.resolve(), log=_log,
                  extender=not args.no_extender).run(timeout=args.timeout, extra=extra)
    if result.settled and not args.no_real_node:
        _demo_real_node(args, cluster)
    _print_summary(args, cluster, result)
    _log(f"demo: {'ready' if result.settled else 'NOT settled'} in "
         f"{time.monotonic() - t0:.1f}s")
    return 0 if result.settled else 1


def _up_real_node(args: argparse.Namespace, cluster: DevCluster, machine: Path) -> RealNode:
    """The real node of ``dev up --real-node`` (and the demo's), in the mode asked for;
    with ``--install`` its agent is the installed DaemonSet's pod, not a host process."""
    return RealNode(cluster, machine, policy=args.topology_policy,
                    mode=MODE_NRI if args.nri else MODE_KUBELET,
                    host_agent=getattr(args, "install", None) is None,
                    dra=bool(getattr(args, "dra", False))).up(
        log=_log, timeout=max(args.timeout, 240.0))


def _demo_real_node(args: argparse.Namespace, cluster: DevCluster) -> None:
    """The demo's real node: asked for with --real-node, else where containers can run."""
    reason = cannot_run_containers()
    if args.real_node is None and reason is not None:
        _log(f"demo: no real node ({reason}); the emulated nodes show the rest")
        return
    t0 = time.monotonic()
    ensure_node_built(log=_log)
    _up_real_node(args, cluster, args.real_node or REAL_NODE_MACHINE)
    _log(f"demo: real node 'localhost' ready in {time.monotonic() - t0:.1f}s "
         "(a kubelet and containerd; see README 'A real node')")


def _print_summary(args: argparse.Namespace, cluster: DevCluster, result: DemoResult) -> None:
    kubectl = Kubectl(result.kubeconfig)
    kube = cluster.kube()
    out: list[str] = []
    out += ["", "$ kubectl get nt", kubectl("get", "nt").rstrip()]
    out += ["", "$ kubectl get tp", kubectl("get", "tp").rstrip()]
    out += ["", "Sample pods:",
            kubectl("get", "pods", "-A", "-l", "app in (trainer,etl,packet-processor)",
                    "-o", "custom-columns=NAMESPACE:.metadata.namespace,NAME:.metadata.name,"
                    "STATUS:.status.phase,NODE:.spec.nodeName").rstrip()]
    if cluster.extender_url is not None and not args.no_extender:
        out += ["", f"Scheduler extender: on ({cluster.extender_url}): pods are placed where "
                    "their own policy fits; namespace rt ran with it stopped, to show what "
                    "the operator does when a node rejects a pod ('--no-extender': none)"]
    else:
        out += ["", "Scheduler extender: off: nodes reject what does not align and the "
                    "operator redeploys it"]
    events = story(kube, result.namespaces)
    if events:
        out += ["", "Rejections and redeploys:"] + [f"  {e}" for e in events]
    trainer = next(iter(pods_of(kube, "ml")), "POD")
    flags = _cluster_flags(args)
    tips = [(f"export KUBECONFIG={result.kubeconfig}", "")]
    if shutil.which("numalign") is None and sys.prefix != sys.base_prefix:
        venv = Path(sys.prefix)
        with contextlib.suppress(ValueError):
            venv = venv.relative_to(Path.cwd())
        tips.append((f"source {shlex.quote(str(venv))}/bin/activate", "numalign on PATH"))
    tips += [
        ("kubectl get nt group4-gpu-0 -o yaml",
         "zones, distances, GPU groups, each pod's NUMA affinity"),
        (f"numalign explain {trainer} -n ml", "hints, merged candidates, why this one won"),
        ("kubectl get events -n rt", "a rejection and its redeploy"),
        (f"numalign dev down{flags}",
         "stop everything" + ("" if flags else " (or: make down)")),
    ]
    width = max(len(cmd) for cmd, _ in tips)
    out += ["", "What to try next:"]
    out += [f"  {cmd:<{width}}  # {why}" if why else f"  {cmd}" for cmd, why in tips]
    if not result.settled:
        out += ["", "Not settled yet: " + "; ".join(result.unsettled),
                f"Logs: {cluster.state_dir / 'logs'}"]
    # the cluster's events and kubectl's tables: escaped (nothing reaches the terminal raw)
    print(printable("\n".join(out), keep_newlines=True), flush=True)
