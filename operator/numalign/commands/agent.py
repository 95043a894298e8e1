"""``numalign agent``: the node agent.

- ``numalign agent --emulate MACHINE.yaml[=COUNT]...``: many emulated nodes in one process,
  named ``<machine name>-<i>``, admitting the pods bound to them as a kubelet would.
- ``numalign agent --node NAME [--root /] [--pod-resources SOCKET] [--kubelet-config FILE]``:
  a real node; discovery and NodeTopology publishing (the node's kubelet admits its pods).
  With the kubelet's pod-resources socket, the status shows the kubelet's allocations
  (PodResources API) and, with its configuration file, its Topology Manager policy.
  With ``--nri-socket PATH`` (the container runtime's NRI socket), on a node labelled
  ``numalign.io/managed=nri`` whose kubelet's CPU, memory and Topology managers are off,
  numalign places the containers itself: each pod under its own resolved policy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from numalign.agent import podfingerprint as pfp
from numalign.commands import logs
from numalign.topology.errors import TopologyError
from numalign.topology.machine import Machine, load_machine

if TYPE_CHECKING:
    from numalign.agent.nrt import NrtOptions

PROG = "numalign agent"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--emulate", "--machine", action="append", dest="emulate",
                      metavar="MACHINE.yaml[=COUNT]",
                      help="emulate COUNT (default 1) nodes of this machine file; repeatable")
    mode.add_argument("--node", metavar="NAME",
                      help="run on the real node NAME (default: $NODE_NAME)")
    p.add_argument("--root", default="/", help="sysfs root for discovery (--node); default /")
    p.add_argument("--pod-resources", metavar="SOCKET",
                   help="--node: the kubelet's pod-resources socket (e.g. "
                        "/var/lib/kubelet/pod-resources/kubelet.sock): report the kubelet's "
                        "allocations in NodeTopology status")
    p.add_argument("--kubelet-config", metavar="FILE",
                   help="--node: the kubelet's configuration file (KubeletConfiguration): "
                        "its Topology Manager policy, scope and options, CPU and memory "
                        "manager policies, reserved CPUs (default: the kubelet's defaults)")
    p.add_argument("--nri-socket", metavar="SOCKET",
                   help="--node: the container runtime's NRI socket (e.g. "
                        "/var/run/nri/nri.sock): on a node labelled numalign.io/managed=nri, "
                        "register numalign as an NRI plugin and set each container's cpuset "
                        "under its pod's resolved policy (the kubelet's CPU, memory and "
                        "Topology managers must be off there)")
    p.add_argument("--refresh-interval", type=float, default=10.0,
                   help="--node with --pod-resources: seconds between readings besides "
                        "those on pod events (default 10)")
    p.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, ~/.kube/config, "
                                        "else in-cluster)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--start", type=int, default=0,
                   help="number of the first emulated node of each machine (default 0)")
    p.add_argument("--lease-interval", type=float, default=10.0,
                   help="seconds between node Lease renewals (default 10)")
    p.add_argument("--publish-interval", type=float, default=None,
                   help="at most one NodeTopology status write per node per this many "
                        "seconds (default: 1, or one per 50 emulated nodes)")
    p.add_argument("--concurrency", type=int, default=96,
                   help="concurrent pod writes (default 96)")
    p.add_argument("--lease-namespace", metavar="NAMESPACE",
                   help="--node: where the node's Lease numalign-agent-<node> is kept (one "
                   "agent per node; default: $POD_NAMESPACE, else default)")
    p.add_argument("--dra", action="store_true",
                   help="with --emulate: publish the machine files' devices as ResourceSlices "
                        "of the emulated DRA driver (emulated.numalign.io) instead of "
                        "extended resources")
    p.add_argument("--publish-nrt", action="store_true",
                   help="also publish each node's NodeResourceTopology "
                        "(topology.node.k8s.io/v1alpha2, for topology-aware schedulers) "
                        "after each NodeTopology status write; needs its CRD (config/nrt)")
    p.add_argument("--nrt-fingerprint-method", choices=pfp.METHODS, default=pfp.METHOD_EXCLUSIVE,
                   help="pods the NodeResourceTopology's nodeTopologyPodsFingerprint covers: "
                        "those holding exclusive resources (default) or all")
    p.add_argument("--nrt-informer-mode", choices=pfp.INFORMER_MODES,
                   default=pfp.INFORMER_DEDICATED,
                   help="the scheduler plugin's cache informerMode the fingerprint agrees "
                        "with: Dedicated (its default: pods not Pending) or Shared (Running)")
    p.add_argument("--no-nrt-topology-policies", dest="nrt_topology_policies",
                   action="store_false",
                   help="leave out the deprecated topologyPolicies field of "
                        "NodeResourceTopology (its attributes say the same)")
    p.add_argument("--metrics-port", type=int, default=0,
                   help="serve Prometheus metrics on this port (default: off): the kubelet's "
                        "Topology, CPU and memory manager metrics (numalign_ prefix) of the "
                        "nodes numalign decides pods for")
    p.add_argument("--metrics-addr", default="0.0.0.0",
                   help="address of --metrics-port (default 0.0.0.0)")
    p.add_argument("--log-level", default=os.environ.get("NUMALIGN_LOG_LEVEL", "INFO"))
    return p


def _nrt_options(args: argparse.Namespace) -> NrtOptions:
    from numalign.agent.nrt import NrtOptions

    return NrtOptions(args.nrt_fingerprint_method, args.nrt_informer_mode,
                      args.nrt_topology_policies)


def parse_emulate(items: list[str]) -> list[tuple[Machine, int]]:
    """``FILE[=COUNT]`` arguments -> machines; TopologyError names the file and field."""
    out: list[tuple[Machine, int]] = []
    for item in items:
        path, sep, count_s = item.rpartition("=")
        if not sep or not count_s.isdigit():
            path, count = item, 1
        else:
            count = int(count_s)
            if count < 1:
                raise TopologyError(item, "COUNT must be at least 1")
        out.append((load_machine(path), count))
    return out


async def _serve(coro: Coroutine[Any, Any, None]) -> int:
    task = asyncio.ensure_future(coro)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        return 0
    return 0


def _metrics(args: argparse.Namespace, states: Any, emulator: Any = None) -> None:
    """``/metrics``: the managers' metrics of ``states`` (a mapping of NodeStates), and the
    emulator's totals."""
    from prometheus_client import Gauge

    from numalign.agent import metrics

    metrics.register(lambda: list(states.values()))
    if emulator is not None:
        g = Gauge("numalign_agent_pods", "pods decided by the agent", ["result"])
        g.labels("admitted").set_function(lambda: emulator.stats.admitted)
        g.labels("rejected").set_function(lambda: emulator.stats.rejected)
        g.labels("released").set_function(lambda: emulator.stats.released)
        Gauge("numalign_agent_nodes", "emulated nodes").set_function(
            lambda: len(emulator.states))
    metrics.serve(args.metrics_port, args.metrics_addr)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    logs.configure(getattr(logging, str(args.log_level).upper(), logging.INFO))
    from numalign.api.kube import Kube, load_config

    if args.emulate and (args.pod_resources or args.kubelet_config or args.nri_socket):
        print(f"{PROG}: error: --pod-resources, --kubelet-config and --nri-socket are for "
              "--node (a real node's kubelet and runtime); emulated nodes hold their own "
              "allocations", file=sys.stderr)
        return 2
    if args.dra and not args.emulate:
        print(f"{PROG}: error: --dra is a mode of --emulate (a real node's DRA devices come "
              "from its drivers)", file=sys.stderr)
        return 2
    try:
        if args.emulate:
            machines = parse_emulate(args.emulate)
        else:
            name = args.node or os.environ.get("NODE_NAME", "")
            if not name:
                print(f"{PROG}: error: --node NAME (or $NODE_NAME) is required", file=sys.stderr)
                return 2
            from numalign.agent.node import discover_machine

            machine = discover_machine(name, args.root)
            if args.kubelet_config:
                from numalign.agent.kubelet_config import load_kubelet_config

                load_kubelet_config(args.kubelet_config)  # a bad file: one line, exit 1
    except TopologyError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # discovery errors: one line
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    try:
        config = load_config(args.kubeconfig, args.context)
    except Exception as e:  # one line, no traceback
        print(f"{PROG}: error: cannot load Kubernetes credentials: {e}", file=sys.stderr)
        return 1

    kube = Kube(config, max_connections=max(8, args.concurrency + 8),
                user_agent="numalign-agent")

    async def run() -> None:
        try:
            if args.emulate:
                from numalign.agent.emulate import Emulator, expand

                nodes = expand(machines, args.start)
                interval = args.publish_interval
                if interval is None:
                    interval = max(1.0, len(nodes) / 50)
                emulator = Emulator(kube, nodes, lease_interval=args.lease_interval,
                                    publish_interval=interval,
                                    concurrency=args.concurrency,
                                    publish_nrt=args.publish_nrt,
                                    nrt_options=_nrt_options(args), dra=args.dra)
                if args.metrics_port:
                    _metrics(args, emulator.states, emulator)
                await emulator.run()
            else:
                from numalign.agent.lease import NodeLease
                from numalign.agent.node import NodeAgent

                namespace = args.lease_namespace or os.environ.get("POD_NAMESPACE") or "default"
                identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
                lease = NodeLease(kube, name, namespace, identity)
                node = NodeAgent(kube, name, machine, publish_nrt=args.publish_nrt,
                                nrt_options=_nrt_options(args),
                                pod_resources=args.pod_resources,
                                kubelet_config=args.kubelet_config,
                                refresh=args.refresh_interval, lease=lease,
                                nri_socket=args.nri_socket, sysfs_root=args.root)
                if args.metrics_port:
                    _metrics(args, node.states)
                await node.run()
        finally:
            await kube.close()

    try:
        return asyncio.run(_serve(run()))
    except KeyboardInterrupt:
        return 0
