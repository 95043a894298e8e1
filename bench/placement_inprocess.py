"""The placement bench's in-process half (bench/bench_placement.py): the extender's
decision module and its Fleet timed without a cluster, over synthetic nodes of the
bench's machine mix (agent states whose NodeTopologies are published and read back as
JSON)."""

from __future__ import annotations

import gc
import json
import random
import time
from typing import Any

from bench_agent import pct
from numalign.topology.machine import load_machine
from placement_workload import NS_BE, NS_RESTRICTED, NS_SNN, node_mix, workload


def with_resolved(pod: dict[str, Any], uid: str) -> dict[str, Any]:
    """``pod`` as the operator annotates it (its namespace's resolved policy), with ``uid``."""
    from numalign.api.names import ANN_RESOLVED
    from numalign.api.resolved import NO_OPTIONS, Resolved

    resolved = {NS_SNN: Resolved("single-numa-node", "pod", NO_OPTIONS, "TopologyPolicy/snn"),
                NS_RESTRICTED: Resolved("restricted", "container", NO_OPTIONS,
                                        "TopologyPolicy/r"),
                NS_BE: Resolved("best-effort", "container", NO_OPTIONS, "TopologyPolicy/be")}
    meta = pod["metadata"]
    ann = {**meta.get("annotations", {}), ANN_RESOLVED: resolved[meta["namespace"]].annotation()}
    return {**pod, "metadata": {**meta, "uid": uid, "annotations": ann}}


def admit(st: Any, pod: dict[str, Any]) -> bool:
    """The emulated node ``st`` decides ``pod`` (and keeps it when admitted)."""
    from numalign.api.effective import NodeKind, NodePolicy, effective_policy

    eff = effective_policy(pod, NodePolicy(NodeKind.EMULATED, st.default))
    return bool(st.decide(pod, eff).admit)


def published(st: Any) -> dict[str, Any]:
    """The NodeTopology of the agent state ``st``, as a client reads it back."""
    from numalign.agent.publish import build_status, nodetopology_object

    st.version += 1
    nt = nodetopology_object(st.name)
    nt["metadata"]["resourceVersion"] = str(st.version)
    nt["status"] = build_status(st)
    return dict(json.loads(json.dumps(nt)))


def synthetic_fleet(nodes: int, seed: int) -> tuple[Any, dict[str, Any]]:
    """A Decider over ``nodes`` synthetic nodes of the bench's machine mix, each holding a
    random share of the workload's pods (its NodeTopology published and read back as
    JSON), and the nodes' agent states by name."""
    from numalign.agent.state import NodeState
    from numalign.extender.decide import Decider

    rng = random.Random(seed)
    fill = workload(nodes * 20, seed + 1)
    decider = Decider()
    states: dict[str, NodeState] = {}
    k = 0
    for f, count in node_mix(nodes):
        machine = load_machine(f)
        for i in range(count):
            st = states.setdefault(f"{machine.name}-{i}", NodeState(f"{machine.name}-{i}",
                                                                    machine))
            for _ in range(rng.randint(0, 30)):
                k += 1
                admit(st, with_resolved(fill[k % len(fill)], f"fill-{k}"))
            decider.update(published(st))
    return decider, dict(states)


def inprocess_filter(nodes: int, pods: int, seed: int) -> dict[str, Any]:
    """The decision module's filter over ``nodes`` synthetic nodes (the bench's machine
    mix, each holding a random share of the workload's pods, published as NodeTopology
    and read back as JSON), for ``pods`` pods of the workload, scheduled as the scheduler
    would: each pod filtered over every node, bound to the best-scored node that fits,
    which then publishes again. Reports ms per filter call (all nodes): over every call,
    and split into the calls of a pod shape seen for the first time under its policy
    (cold: no verdict cached) and the others. The nodes' ledgers are built as their
    NodeTopologies arrive (setup), as the extender builds them on its watch."""
    t0 = time.perf_counter()
    decider, states = synthetic_fleet(nodes, seed)
    setup = time.perf_counter() - t0
    names = list(states)
    cold: list[float] = []
    warm: list[float] = []
    seen: set[str] = set()
    bound = 0
    for i, p in enumerate(workload(pods, seed + 2)):
        pod = with_resolved(p, f"q-{i}")
        # cold: a shape under a policy (its namespace's) not filtered before
        shape = f'{pod["metadata"]["labels"]["shape"]} {pod["metadata"]["namespace"]}'
        t = time.perf_counter()
        verdicts = decider.filter(pod, names)
        (warm if shape in seen else cold).append(time.perf_counter() - t)
        seen.add(shape)
        fits = [(v.score, v.node) for v in verdicts if v.fits]
        if fits:
            node = max(fits)[1]
            bound += admit(states[node], pod)
            decider.update(published(states[node]))
    every = cold + warm
    return {"synthetic_nodes": len(names), "filter_calls": len(every), "bound": bound,
            "distinct_node_states": len({(v.machine_key, v.held_key)
                                         for v in decider.views.values()}),
            "setup_s": round(setup, 1),
            **{f"filter_p{p}_ms": round(1000 * pct(every, p), 2) for p in (50, 99)},
            **{f"cold_p{p}_ms": round(1000 * pct(cold, p), 2) for p in (50, 99)},
            "cold_max_ms": round(1000 * max(cold, default=0.0), 2),
            **{f"warm_p{p}_ms": round(1000 * pct(warm, p), 2) for p in (50, 99)},
            "cold_calls": len(cold)}


def cold_filter(nodes: int, seed: int, rounds: int = 2) -> dict[str, Any]:
    """The first filter of a pod shape (no verdict, group answer, merge or hint list
    cached) over ``nodes`` synthetic nodes (:func:`synthetic_fleet`), for a pod of each
    of the workload's shapes, ``rounds`` times: as the extender's filter decides it
    (``cold``: pass or refuse, nodes alike sharing one decision,
    :mod:`numalign.extender.feasible`), as prioritize completes it (``full``: every
    node's allocation and score, merges shared between nodes of the same free counts)
    and as a baseline in the same run, each node's full decision made afresh (no merge
    shared); the collector paced between the calls as the server paces it. Reports ms
    per filter call (all nodes) of each, the baseline's ratio to
    ``cold``, and the nodes whose pass or refusal (reason, message) differ between the
    three (none: both shortcuts are exact)."""
    from numalign.extender.decide import Decider
    from numalign.topology import admit as engine
    from numalign.topology import demands

    t0 = time.perf_counter()
    decider, states = synthetic_fleet(nodes, seed)
    setup = time.perf_counter() - t0
    names = list(states)
    pods: dict[str, dict[str, Any]] = {}
    for p in workload(400, seed + 2):
        pods.setdefault(p["metadata"]["labels"]["shape"], p)

    def cold(d: Decider, pod: dict[str, Any], shared: bool, complete: bool
             ) -> tuple[float, list[Any]]:
        d._cache.clear()
        d._cached_for.clear()
        d.fast.clear()
        engine._DECISIONS.clear()
        demands._hint_cache.clear()
        engine.SHARE_DEMAND_MERGES = shared
        # between requests the server's GC pacer collects the young generations and
        # freezes the survivors (numalign.extender.server.GcPacer): without it, a full
        # collection over what the previous timings left lands in this one
        gc.collect(1)
        gc.freeze()
        try:
            t = time.perf_counter()
            got = d.filter(pod, names, complete=complete)
            return time.perf_counter() - t, [(v.node, v.fits, v.reason, v.message, v.covered)
                                              for v in got]
        finally:
            engine.SHARE_DEMAND_MERGES = True

    fast: list[float] = []
    full: list[float] = []
    base: list[float] = []
    differ = 0
    # the fleet's objects out of the collector's reach (as a server would after its
    # start): a full collection over them would land in one timing or the other
    gc.collect()
    gc.freeze()
    for r in range(rounds):
        for i, p in enumerate(pods.values()):
            pod = with_resolved(p, f"cold-{r}-{i}")
            t_base, want = cold(decider, pod, False, True)
            t_full, whole = cold(decider, pod, True, True)
            t_fast, got = cold(decider, pod, True, False)
            base.append(t_base)
            full.append(t_full)
            fast.append(t_fast)
            differ += sum(1 for a, b, c in zip(want, whole, got, strict=True)
                          if not a == b == c)
    gc.unfreeze()
    out: dict[str, Any] = {"synthetic_nodes": len(names), "setup_s": round(setup, 1),
                           "cold_calls": len(fast), "verdicts_differing": differ}
    for name, times in (("cold", fast), ("full", full), ("baseline", base)):
        out.update({f"{name}_p{q}_ms": round(1000 * pct(times, q), 2) for q in (50, 99)})
        out[f"{name}_max_ms"] = round(1000 * max(times, default=0.0), 2)
    out["speedup_p50"] = round(pct(base, 50) / max(pct(fast, 50), 1e-9), 2)
    out["speedup_p99"] = round(pct(base, 99) / max(pct(fast, 99), 1e-9), 2)
    return out


def inprocess_scheduler(nodes: int, pods: int, seed: int, lag: int = 40,
                        bind_lag: int = 8, bind_verb: bool = False,
                        verb_lag: int | None = None) -> dict[str, Any]:
    """What the scheduler asks the extender (:class:`numalign.extender.fleet.Fleet`, as
    its server runs it) for ``pods`` pods over ``nodes`` empty nodes of the bench's mix:
    for each pod, filter over the nodes its resource requests fit (the scheduler's own
    check, counting the pods it bound), prioritize over the nodes that passed (the
    ExtenderArgs JSON parsed, the answers serialized), the binding made ``bind_lag``
    pods later (the pods filtered meanwhile see it in flight): by the extender's bind
    verb (``bind_verb``: the ExtenderBindingArgs parsed; its Binding's API call not
    counted), else seen on the pod watch; with ``verb_lag`` (below ``bind_lag``) the bind
    verb arrives that many pods after the filter and waits there until its binding
    lands (a busy API server: the verb names the node at once, the binding is slow); each
    node admits and publishes ``lag`` pods after the binding (the agent's
    coalesced writes), so reservations and pods in flight are counted meanwhile.
    Reports ms per filter and per prioritize call, the pods placed per second, and the
    pods a node refused after the extender approved them (the two disagreeing)."""
    from numalign.agent.state import NodeState
    from numalign.extender.fleet import Fleet
    from numalign.extender.protocol import (
        filter_result,
        parse_args,
        parse_binding,
        priority_list,
    )
    from numalign.extender.server import GcPacer
    from numalign.topology.pod import pod_from_dict
    from numalign.topology.resourcefit import check_fit, fit_requests

    states: dict[str, NodeState] = {}
    for f, count in node_mix(nodes):
        machine = load_machine(f)
        for i in range(count):
            states[f"{machine.name}-{i}"] = NodeState(f"{machine.name}-{i}", machine)

    fleet = Fleet()
    fleet.load_nodetopologies([published(st) for st in states.values()])
    pacer = GcPacer()  # as the extender's server runs the collector, between requests
    names = list(states)
    pending: list[tuple[int, str, dict[str, Any]]] = []
    binding: list[tuple[int, dict[str, Any], bytes | None]] = []
    verbs: list[tuple[int, str, str]] = []  # (pod index, uid, node): the verb has arrived
    binds: list[float] = []
    unclaimed = 0
    filters: list[float] = []
    priorities: list[float] = []
    asked: dict[str, list[dict[str, int]]] = {n: [] for n in names}
    bound = refused = unplaced = 0
    t_all = time.perf_counter()
    for i, p in enumerate(workload(pods, seed + 3)):
        pod = with_resolved(p, f"s-{i}")
        model = pod_from_dict(pod)
        # the scheduler's own resource fit, with the pods it bound counted at once
        fitting = [n for n in names if check_fit(states[n].machine, model, asked[n]) is None]
        body = json.dumps({"Pod": pod, "NodeNames": fitting}).encode()
        t = time.perf_counter()
        args = parse_args(body)
        verdicts = fleet.filter(args.pod, args.node_names)
        result = filter_result(args, verdicts)
        json.dumps(result)
        filters.append(time.perf_counter() - t)
        passed = [v.node for v in verdicts if v.fits]
        if passed:
            body = json.dumps({"Pod": pod, "NodeNames": passed}).encode()
            t = time.perf_counter()
            args = parse_args(body)
            scores = priority_list(fleet.filter(args.pod, args.node_names, approve=False))
            json.dumps(scores)
            priorities.append(time.perf_counter() - t)
            node = max((s["Score"], s["Host"]) for s in scores)[1]
            binding.append((i + bind_lag, {**pod, "spec": {**pod["spec"], "nodeName": node}},
                            None))
            if bind_verb:  # the pod watch sees the binding the extender made later
                binding[-1] = (i + bind_lag, binding[-1][1], json.dumps({
                    "PodName": pod["metadata"]["name"],
                    "PodNamespace": pod["metadata"]["namespace"],
                    "PodUID": pod["metadata"]["uid"], "Node": node}).encode())
                if verb_lag is not None and verb_lag < bind_lag:
                    verbs.append((i + verb_lag, pod["metadata"]["uid"], node))
            pending.append((i + lag, node, pod))
            asked[node].append(fit_requests(model))
        else:
            unplaced += 1
        if i % 10 == 9:
            pacer.tick()
        while verbs and verbs[0][0] <= i:
            _, uid, node = verbs.pop(0)
            fleet.in_flight.heading(uid, node)
        while binding and binding[0][0] <= i:
            _, seen, verb = binding.pop(0)
            if verb is not None:
                t = time.perf_counter()
                b = parse_binding(verb)
                if fleet.claim(b.uid, b.node) is None:
                    unclaimed += 1
                binds.append(time.perf_counter() - t)
            fleet.pod("MODIFIED", seen)
        while pending and pending[0][0] <= i:
            _, node, done = pending.pop(0)
            if admit(states[node], done):
                bound += 1
            else:  # the node refused it: the pod watch sees it Failed
                refused += 1
                asked[node].remove(fit_requests(pod_from_dict(done)))
                fleet.pod("MODIFIED", {**done, "spec": {**done["spec"], "nodeName": node},
                                       "status": {"phase": "Failed"}})
            fleet.node_topology("MODIFIED", published(states[node]))
    took = time.perf_counter() - t_all
    pacer.close()
    return {"nodes": len(names), "pods": pods, "bind_verb": bind_verb, "bind_lag": bind_lag,
            "verb_lag": verb_lag,
            "admitted": bound, "refused_by_node": refused, "no_node": unplaced,
            "bind_refused": unclaimed,
            **({f"bind_p{q}_ms": round(1000 * pct(binds, q), 2) for q in (50, 99)}
               if binds else {}),
            "pods_per_s": round(pods / took, 1),
            **{f"filter_p{q}_ms": round(1000 * pct(filters, q), 2) for q in (50, 99)},
            **{f"prioritize_p{q}_ms": round(1000 * pct(priorities, q), 2) for q in (50, 99)}}


def scheduler_lines(nodes: int, pods: int, seed: int) -> dict[str, Any]:
    """:func:`inprocess_scheduler` as the bench's lines run it, printed: the binding seen
    on the pod watch 8 pods later (no bind verb), or made by the bind verb after the next
    pod's filter (the scheduler binds asynchronously), or 30 pods later (a burst on a busy
    API server: many pods in flight on each node), the verb 30 pods late or naming its
    node after the next pod's filter and waiting for its binding to land."""
    out: dict[str, Any] = {}
    for key, lag, verb, verb_lag in (("scheduler_watch", 8, False, None),
                                     ("scheduler", 1, True, None),
                                     ("scheduler_late", 30, True, None),
                                     ("scheduler_slow_api", 30, True, 1)):
        sched = out[key] = inprocess_scheduler(nodes, pods, seed, bind_lag=lag,
                                               bind_verb=verb, verb_lag=verb_lag)
        how = "bind verb" if verb else "binding seen on the pod watch"
        if verb_lag is not None:
            how += f" after {verb_lag} pod(s), its binding landing"
        print(f"in-process filter+prioritize+bind over {sched['nodes']} nodes ({how}, "
              f"{lag} pod(s) later), {sched['pods']} pods ({sched['admitted']} "
              f"admitted, {sched['refused_by_node']} refused by their node, "
              f"{sched['no_node']} passed by no node), "
              f"{sched['pods_per_s']} pods/s: filter p50 {sched['filter_p50_ms']} ms, "
              f"p99 {sched['filter_p99_ms']} ms; prioritize p50 "
              f"{sched['prioritize_p50_ms']} ms, p99 {sched['prioritize_p99_ms']} ms"
              + (f"; bind p50 {sched['bind_p50_ms']} ms, p99 {sched['bind_p99_ms']} ms "
                 f"({sched['bind_refused']} left to the scheduler)" if verb else ""),
              flush=True)
    return out
