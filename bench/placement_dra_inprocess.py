"""The extender with DRA claims in bursts, in-process
(``python bench/run.py placement --dra --modes= --inprocess-pods=400``).

What kube-scheduler asks the extender (:class:`numalign.extender.fleet.Fleet`, as its
server runs it, with a :class:`numalign.extender.dra.DraCatalog`) for the DRA bench's
pods over its emulated DRA nodes, one pod after another as the scheduling cycle runs:
filter over the nodes the pod's CPUs fit, prioritize over those that passed, the best
node taken. The allocator then picks the claim's devices there (first fit in the
slices' order, inside one NUMA node where the claim's ``matchAttribute`` asks it, among
the devices neither allocated nor picked for a pod before): the extender sees that
allocation ``alloc_lag`` pods later (the binding cycle's PreBind writes it), the bind
verb ``bind_lag`` pods later, and the node admits the pod with those devices and
publishes ``lag`` pods later (the agent's coalesced writes). So each filter sees pods
in flight with claims not allocated yet, as in the cluster's bursts, without the
cluster's shared cores in the figure.

A pod no node passes goes back to the queue :data:`RETRY_AFTER` cycles later, at most
:data:`RETRIES` times, as kube-scheduler retries it once pods are bound.

Reports ms per filter (wall and CPU time) and per prioritize call, the engine runs per
filter (the decider's cache misses), the pods placed per second, the retries and the pods
no node took, and the pods a node refused after the extender approved them (they would
be ``TopologyAffinityError``s).
"""

from __future__ import annotations

import copy
import time
from typing import Any

from bench_agent import pct
from bench_placement_dra import claim_of, node_mix, resolved_pod, templates, workload
from numalign.api import draemulated as de
from numalign.topology.machine import load_machine
from placement_inprocess import published

RETRIES = 5  # times a pod no node passes is tried again (then it counts as no node)
RETRY_AFTER = 10  # scheduling cycles later (kube-scheduler's backoff, the pods bound meanwhile)


def _allocate(cat: Any, pod: dict[str, Any], node: str, numa: list[int],
              picked: set[str]) -> tuple[list[dict[str, str]], Any] | None:
    """The devices kube-scheduler's allocator gives the pod's claims on ``node`` (first
    fit in the slices' order; one NUMA node where ``matchAttribute`` asks it), besides
    those in use or ``picked`` for pods before; None: none fit. With them, the choice
    (:data:`numalign.api.draasks.Placement` per request) the node admits it with."""
    asks, _ = cat.asks(pod)
    offer = cat.offer(node, numa)
    results: list[dict[str, str]] = []
    choice: dict[tuple[str, str], Any] = {}
    for ask in asks:
        for request, ways in ask.requests:
            way = ways[0]
            sel = cat.class_selectors([way.device_class])[way.device_class] or []
            free = [d for d in offer.matching(way, sel)
                    if d.id not in cat.in_use and d.id not in picked]
            count = way.count or len(free)
            got: list[Any] = []
            if request in ask.same_numa:
                groups: dict[Any, list[Any]] = {}
                for d in free:
                    groups.setdefault(d.numa_nodes, []).append(d)
                got = next((g[:count] for g in groups.values() if len(g) >= count), [])
            else:
                got = free[:count]
            if len(got) < count:
                return None
            picked |= {d.id for d in got}
            results += [{"request": request, "driver": d.driver, "pool": d.pool,
                         "device": d.device} for d in got]
            groups_used = tuple(sorted({d.numa_nodes for d in got if d.numa_nodes is not None}))
            unknown = sum(1 for d in got if d.numa_nodes is None)
            choice[(ask.claim.name, request)] = (groups_used, unknown, count)
    return results, choice


def dra_scheduler(nodes: int, pods: int, seed: int, lag: int = 20, bind_lag: int = 6,
                  alloc_lag: int = 3, room_check: bool = True, defer: bool = True,
                  trace: dict[str, Any] | None = None) -> dict[str, Any]:
    """The bursts of the DRA bench, in-process (see the module docstring).
    ``room_check`` and ``defer`` False: the extender decides every way the pods in
    flight may land on every node (the baseline); ``trace``: each placed pod's node,
    choice, verdict, pods in flight and reservations by name, and the refused ones under
    ``_refused``."""
    from numalign.agent.state import NodeState
    from numalign.api.dra import node_devices
    from numalign.api.draclaims import emulated_kind_of, pod_dra_devices
    from numalign.api.effective import NodeKind, NodePolicy, effective_policy
    from numalign.extender.decide import Decider
    from numalign.extender.dra import DraCatalog
    from numalign.extender.fleet import Fleet
    from numalign.extender.protocol import filter_result, parse_args, priority_list
    from numalign.extender.server import GcPacer
    from numalign.topology.managers.dra import DraDevices
    from numalign.topology.pod import pod_from_dict
    from numalign.topology.resourcefit import check_fit, fit_requests

    cat = DraCatalog()
    fleet = Fleet(Decider(dra=cat))
    fleet.decider.room_check = room_check
    fleet.defer = defer
    pacer = GcPacer()  # as the extender's server runs the collector, between requests
    states: dict[str, NodeState] = {}
    slices: list[dict[str, Any]] = []
    resources: set[str] = set()
    for f, count in node_mix(nodes):
        machine = load_machine(f)
        resources |= {d.resource for d in machine.devices}
        for i in range(count):
            name = f"{machine.name}-{i}"
            states[name] = NodeState(name, machine)
            slices += de.resource_slices(machine, name)
    cat.load("deviceclasses", de.device_classes(resources))
    cat.load("resourceslices", slices)
    cat.load("resourceclaims", [])
    cat.load("resourceclaimtemplates", templates())
    fleet.load_nodetopologies([published(st) for st in states.values()])
    names = list(states)
    by_node: dict[str, list[dict[str, Any]]] = {}
    for sl in slices:
        by_node.setdefault(sl["spec"]["nodeName"], []).append(sl)
    numa = {n: [x.id for x in st.machine.numa_nodes] for n, st in states.items()}
    node_slices = {n: node_devices(by_node.get(n, []), n, None, numa[n]).devices
                   for n in names}
    asked: dict[str, list[dict[str, int]]] = {n: [] for n in names}
    picked: dict[str, set[str]] = {n: set() for n in names}
    # (due, what): claims allocated, bindings, node admissions, in the scheduler's order
    allocs: list[tuple[int, dict[str, Any]]] = []
    binds: list[tuple[int, str, str]] = []
    admits: list[tuple[int, str, dict[str, Any], Any, list[str]]] = []
    filters: list[float] = []
    cpu: list[float] = []  # the filter's CPU time (wall time counts other processes too)
    priorities: list[float] = []
    runs: list[int] = []
    bound = refused = unplaced = unclaimed = 0
    refusals: list[str] = []
    t_all = time.perf_counter()
    arrivals = iter(enumerate(workload(pods, seed + 5)))
    # pods no node passed, back in the queue RETRY_AFTER scheduling cycles later
    retry: list[tuple[int, int, dict[str, Any], dict[str, Any] | None]] = []
    retried = 0
    i = -1  # the scheduling cycle
    while True:
        i += 1
        if retry and retry[0][0] <= i:
            _, attempts, pod, claim = retry.pop(0)
        else:
            nxt = next(arrivals, None)
            if nxt is None:
                if not retry:
                    break
                _, attempts, pod, claim = retry.pop(0)
            else:
                attempts, pod = 0, resolved_pod(nxt[1], f"d-{nxt[0]}")
                claim = claim_of(pod)
                if claim is not None:
                    cat.event("resourceclaims", "ADDED", claim)
        model = pod_from_dict(pod)
        fitting = [n for n in names if check_fit(states[n].machine, model, asked[n]) is None]
        body = _json(pod, fitting)
        t, c = time.perf_counter(), time.thread_time()
        misses = fleet.decider.misses
        args = parse_args(body)
        verdicts = fleet.filter(args.pod, args.node_names)
        _dump(filter_result(args, verdicts))
        filters.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - c)
        runs.append(fleet.decider.misses - misses)
        passed = [v.node for v in verdicts if v.fits]
        chosen: tuple[str, list[dict[str, str]], Any] | None = None
        if passed:
            body = _json(pod, passed)
            t = time.perf_counter()
            args = parse_args(body)
            scores = priority_list(fleet.filter(args.pod, args.node_names, approve=False))
            _dump(scores)
            priorities.append(time.perf_counter() - t)
            for _, node in sorted((-s["Score"], s["Host"]) for s in scores):
                got = (([], None) if claim is None
                       else _allocate(cat, pod, node, numa[node], picked[node]))
                if got is not None:  # the scheduler's own DRA filter: devices free here
                    chosen = (node, *got)
                    break
        if chosen is None and attempts < RETRIES:
            retried += 1
            retry.append((i + RETRY_AFTER, attempts + 1, pod, claim))
        elif chosen is None:
            unplaced += 1
        else:
            node, results, choice = chosen
            if trace is not None:
                v = next(v for v in verdicts if v.node == node)
                trace[pod["metadata"]["name"]] = (i, node, choice, v, [
                    (p["metadata"]["name"], h.containers) for p, h in
                    fleet.in_flight.on_node(node, exclude=pod["metadata"]["uid"])],
                    fleet.reservations.on_node(node))
            asked[node].append(fit_requests(model))
            if claim is not None:
                done = copy.deepcopy(claim)
                done["status"] = {"allocation": {"devices": {"results": results}}}
                allocs.append((i + alloc_lag, done))
            binds.append((i + bind_lag, pod["metadata"]["uid"], node))
            kind = None
            if claim is not None:  # the node reads the claim's devices as the agent does
                kind = DraDevices(pod_dra_devices(
                    pod, {claim["metadata"]["name"]: done}, node_slices[node],
                    numa[node], emulated_kind_of(states[node].machine)).requests())
            admits.append((i + lag, node, pod, kind,
                           [f"{r['driver']}/{r['pool']}/{r['device']}" for r in results]))
        if i % 10 == 9:
            pacer.tick()
        while allocs and allocs[0][0] <= i:
            cat.event("resourceclaims", "MODIFIED", allocs.pop(0)[1])
        while binds and binds[0][0] <= i:
            _, uid, node = binds.pop(0)
            if fleet.claim(uid, node) is None:
                unclaimed += 1
        while admits and admits[0][0] <= i:
            _, node, done, kind, devices = admits.pop(0)
            st = states[node]
            picked[node] -= set(devices)
            placed = {**done, "spec": {**done["spec"], "nodeName": node}}
            eff = effective_policy(placed, NodePolicy(NodeKind.EMULATED, st.default))
            decision = st.decide(placed, eff, devices=[kind] if kind is not None else [])
            if decision.admit:
                bound += 1
            else:
                refused += 1
                refusals.append(f"{done['metadata']['name']} on {node}: {decision.message}")
                if trace is not None:
                    trace.setdefault("_refused", []).append((done, node, kind, st))
                asked[node].remove(fit_requests(pod_from_dict(done)))
                fleet.pod("MODIFIED", {**placed, "status": {"phase": "Failed"}})
            fleet.node_topology("MODIFIED", published(st))
    took = time.perf_counter() - t_all
    pacer.close()
    return {"nodes": len(names), "pods": pods, "lag": lag, "bind_lag": bind_lag,
            "alloc_lag": alloc_lag, "admitted": bound, "refused_by_node": refused,
            "no_node": unplaced, "retries": retried, "bind_refused": unclaimed,
            "refusals": refusals[:5],
            "pods_per_s": round(pods / took, 1),
            **{f"filter_p{q}_ms": round(1000 * pct(filters, q), 2) for q in (50, 99)},
            "filter_max_ms": round(1000 * max(filters, default=0.0), 2),
            **{f"filter_cpu_p{q}_ms": round(1000 * pct(cpu, q), 2) for q in (50, 99)},
            **{f"prioritize_p{q}_ms": round(1000 * pct(priorities, q), 2) for q in (50, 99)},
            "engine_runs_per_filter_p50": pct([float(r) for r in runs], 50),
            "engine_runs_per_filter_p99": pct([float(r) for r in runs], 99)}


def _json(pod: dict[str, Any], nodes: list[str]) -> bytes:
    import json

    return json.dumps({"Pod": pod, "NodeNames": nodes}).encode()


def _dump(obj: Any) -> None:
    import json

    json.dumps(obj)
