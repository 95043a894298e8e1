"""What a pod's ResourceClaims may get on a node: the device choices kube-scheduler's
allocator could make there (pure).

The extender decides a pod before the scheduler allocates its claims, so it cannot know
which devices the pod will get; it knows which devices each claim request may get on
the node, and decides the pod with every choice that matters (:func:`pod_choices`).

Reading (lenient and bounded; a problem names the claim and the field):

- the pod's claims, ``spec.resourceClaims[]``: by ``resourceClaimName`` (a claim of the
  pod's namespace), or by ``resourceClaimTemplateName``: the claim generated for the pod
  (``status.resourceClaimStatuses[]``) once it is known, else the template's
  ``spec.spec``;
- a claim already allocated (``status.allocation``) has fixed devices;
- else its requests, ``spec.devices.requests[]``: ``exactly`` (``deviceClassName``,
  ``selectors``, ``allocationMode`` ``ExactCount`` with ``count`` (default 1) or
  ``All``) or ``firstAvailable`` (each subrequest may be the one allocated: the choices
  of all of them); a device is a candidate when it matches its class's and the request's
  selectors and no other claim holds it;
- its constraints, ``spec.devices.constraints[]``: a ``matchAttribute`` of
  ``resource.kubernetes.io/numaNode`` (over ``requests``, or all) makes the allocator
  pick those devices on one NUMA node; other constraints are ignored (more choices).

CEL selectors (of requests and DeviceClasses) are evaluated only in a small subset:
an expression that is nothing but terms joined by ``&&``, each term one of

- ``device.driver == "<driver>"``
- ``device.attributes["<domain>"].<name> == <literal>`` (a string in double quotes, an
  integer, ``true`` or ``false``); a device without that attribute does not match (the
  allocator's evaluation fails on it, so it never gets it).

An expression with ``||``, ``!`` or ``?`` (or a single-quoted string) is taken as "may
match" as a whole; a term of another shape (capacity, ``semver``, ``in``, a
parenthesised part...) as "may hold" (the other terms must). So the device stays a
candidate whenever the subset cannot tell. That is an
over-approximation: the extender considers more choices than the allocator has, so under
a policy that needs every choice aligned it can refuse more nodes, never approve a
placement whose devices the node then refuses. Likewise ignored (more choices): two
requests of a pod getting the same device, constraints on other attributes.

A choice is what of the devices matters to admission: for each request, the set of NUMA
nodes its devices are on (and how many devices have none known); two choices alike in
that are decided alike. At most :data:`MAX_CHOICES` choices are listed; past that,
:attr:`PodChoices.complete` is False and the caller treats the unlisted ones as refused
where every choice must pass.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from numalign.topology.managers.dra import NumaNodes

from .draclaims import (
    ClaimDevice,
    ClaimState,
    PodClaim,
    PodDraDevices,
    allocation_results,
    container_claims,
    pod_claims,
)
from .draemulated import DRIVER as EMULATED_DRIVER
from .draemulated import KIND as EMULATED_KIND

NUMA_ATTRIBUTE = "resource.kubernetes.io/numaNode"
MAX_REQUESTS = 32  # per claim (the API's own bound)
MAX_CHOICES = 256  # choices decided per pod and node
MAX_GROUPS = 12  # distinct NUMA placements of one request's candidates enumerated
MAX_SELECTORS = 32
MAX_EXPRESSION = 10_240

JSON = dict[str, Any]
Scalar = str | int | bool


def _map(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _list(v: Any, bound: int) -> list[Any]:
    return list(v[:bound]) if isinstance(v, list) else []


def _str(v: Any) -> str | None:
    return v[:253] if isinstance(v, str) and v else None


# ---------------------------------------------------------------- devices


@dataclass(frozen=True)
class NodeDevice:
    """A device a node's ResourceSlices offer: its NUMA nodes (None: unknown), whether it
    carries the ``numaNode`` attribute (a ``matchAttribute`` on it can hold), its
    attributes (fully qualified name -> value) for the selectors, whether several claims
    may hold it at once."""

    driver: str
    pool: str
    device: str
    numa_nodes: NumaNodes
    numa_attribute: bool = False
    attributes: Mapping[str, Scalar] = field(default_factory=dict)
    shared: bool = False  # allowMultipleAllocations: other claims holding it leave it free

    # set once: its id, and its peers' kind as the emulated node's admission counts it
    # (the emulated driver's devices by their resource, any other by driver and pool)
    id: str = field(default="", init=False, compare=False)
    kind: str = field(default="", init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", f"{self.driver}/{self.pool}/{self.device}")
        kind = f"{self.driver}/{self.pool}"
        if self.driver == EMULATED_DRIVER:
            res = self.attributes.get(f"{EMULATED_DRIVER}/{EMULATED_KIND}")
            if isinstance(res, str):
                kind = f"{EMULATED_DRIVER}/{res}"
        object.__setattr__(self, "kind", kind)


class NodeOffer:
    """A node's devices, with what the choices of every pod read of them kept: the
    devices each request way matches, the NUMA nodes of each kind's devices."""

    def __init__(self, devices: Iterable[NodeDevice]) -> None:
        self.devices = list(devices)
        self.by_id = {d.id: d for d in self.devices}
        self._matched: dict[Hashable, list[NodeDevice]] = {}
        self._peers: dict[frozenset[str], tuple[NumaNodes, ...]] = {}

    def matching(self, way: Request, sel: list[Selector]) -> list[NodeDevice]:
        key = (way.device_class, way.selectors, tuple(sel))
        hit = self._matched.get(key)
        if hit is None:
            hit = self._matched[key] = [d for d in self.devices
                                        if all(s.matches(d) for s in (*sel, *way.selectors))]
        return hit

    def peers(self, kinds: frozenset[str]) -> tuple[NumaNodes, ...]:
        hit = self._peers.get(kinds)
        if hit is None:
            hit = self._peers[kinds] = tuple(p.numa_nodes for p in self.devices
                                             if p.kind in kinds)
        return hit


def device_attributes(driver: str, raw: Any) -> dict[str, Scalar]:
    """A slice device's ``attributes`` as fully qualified name -> scalar value (a name
    without a domain is in the driver's; lists and versions are left out)."""
    out: dict[str, Scalar] = {}
    for name, attr in list(_map(raw).items())[:64]:
        if not isinstance(name, str):
            continue
        full = name if "/" in name else f"{driver}/{name}"
        a = _map(attr)
        for key in ("string", "int", "bool"):
            v = a.get(key)
            if isinstance(v, (str, int, bool)):
                out[full] = v
                break
    return out


# ---------------------------------------------------------------- the CEL subset


_STRING = r'"(?:[^"\\]|\\.)*"'
_DRIVER_TERM = re.compile(rf'^device\.driver\s*==\s*({_STRING})$')
_ATTR_TERM = re.compile(
    rf'^device\.attributes\[\s*({_STRING})\s*\]\.([A-Za-z_][A-Za-z0-9_]*)\s*==\s*'
    rf'({_STRING}|-?[0-9]+|true|false)$')


@dataclass(frozen=True)
class Selector:
    """A CEL expression read in the subset: the terms that must all hold (driver, or
    attribute name -> value), or ``None`` terms: any device may match."""

    terms: tuple[tuple[str, Scalar], ...] | None

    def matches(self, d: NodeDevice) -> bool:
        if self.terms is None:
            return True
        for name, value in self.terms:
            got: Any = d.driver if name == "" else d.attributes.get(name)
            if got is None or type(got) is not type(value) or got != value:
                return False
        return True


def _unquote(text: str) -> str:
    return str(json.loads(text)) if text.startswith('"') else text


def _split_and(expr: str) -> list[str] | None:
    """The ``&&`` terms, or None when the expression holds, outside double-quoted
    strings, an operator that could make a term not required (``||``, ``!``, ``?``) or a
    single-quoted string. A parenthesised part is a term outside the subset (it may
    hold)."""
    terms, cur, i, n = [], [], 0, len(expr)
    while i < n:
        ch = expr[i]
        if ch == '"':
            j = i + 1
            while j < n and expr[j] != '"':
                j += 2 if expr[j] == "\\" else 1
            cur.append(expr[i:j + 1])
            i = j + 1
            continue
        if expr.startswith("&&", i):
            terms.append("".join(cur).strip())
            cur, i = [], i + 2
            continue
        if ch in "|!?'":
            return None
        cur.append(ch)
        i += 1
    terms.append("".join(cur).strip())
    return terms


def parse_selector(expr: Any) -> Selector:
    """A CEL expression as a :class:`Selector` (anything outside the subset: may match)."""
    if not isinstance(expr, str) or len(expr) > MAX_EXPRESSION:
        return Selector(None)
    parts = _split_and(expr.strip())
    if not parts or any(not p for p in parts):
        return Selector(None)
    terms: list[tuple[str, Scalar]] = []
    for p in parts:
        m = _DRIVER_TERM.match(p)
        if m:
            terms.append(("", _unquote(m.group(1))))
            continue
        m = _ATTR_TERM.match(p)
        if not m:  # outside the subset: this term may hold (the others must)
            continue
        lit = m.group(3)
        value: Scalar = (_unquote(lit) if lit.startswith('"') else lit == "true"
                         if lit in ("true", "false") else int(lit))
        terms.append((f"{_unquote(m.group(1))}/{m.group(2)}", value))
    return Selector(tuple(terms))


def selectors_of(raw: Any) -> list[Selector]:
    """``selectors[]`` (``cel.expression`` each) read in the subset."""
    return [parse_selector(_map(_map(s).get("cel")).get("expression"))
            for s in _list(raw, MAX_SELECTORS)]


# ---------------------------------------------------------------- claims


@dataclass(frozen=True)
class Request:
    """One way a claim request may be allocated (a subrequest of ``firstAvailable`` is
    one of several): its main request name, the class, the selectors, ``count`` (None:
    ``All``)."""

    name: str
    device_class: str
    selectors: tuple[Selector, ...]
    count: int | None
    admin: bool = False  # adminAccess: devices in use are candidates too


@dataclass(frozen=True)
class ClaimAsk:
    """One of the pod's claims: allocated (``fixed``: request, driver, pool, device), or
    its requests (main name -> the ways it may be allocated) and the requests a
    ``numaNode`` ``matchAttribute`` ties to one NUMA node; or why it cannot be read."""

    claim: PodClaim
    fixed: tuple[tuple[str, str, str, str], ...] | None = None
    requests: tuple[tuple[str, tuple[Request, ...]], ...] = ()
    same_numa: frozenset[str] = frozenset()
    problem: str | None = None


def _request(where: str, raw: Mapping[str, Any], name: str
             ) -> tuple[Request | None, str | None]:
    cls = _str(raw.get("deviceClassName"))
    if cls is None:
        return None, f"{where}: no deviceClassName"
    mode = raw.get("allocationMode") or "ExactCount"
    count: int | None = None
    if mode == "ExactCount":
        c = raw.get("count", 1)
        if not isinstance(c, int) or isinstance(c, bool) or c < 1 or c > 128:
            return None, f"{where}.count: want an integer 1-128"
        count = c
    elif mode != "All":
        return None, f"{where}.allocationMode: want ExactCount or All, got {mode!r}"[:300]
    return Request(name, cls, tuple(selectors_of(raw.get("selectors"))), count,
                   raw.get("adminAccess") is True), None


def claim_ask(ref: PodClaim, spec: Mapping[str, Any], what: str) -> ClaimAsk:
    """The requests and NUMA constraints of a claim spec (``what`` names it)."""
    devices = _map(spec.get("devices"))
    requests: list[tuple[str, tuple[Request, ...]]] = []
    for i, r in enumerate(_list(devices.get("requests"), MAX_REQUESTS)):
        where = f"{what}: spec.devices.requests[{i}]"
        name = _str(_map(r).get("name"))
        if name is None:
            return ClaimAsk(ref, problem=f"{where}: no name")
        ways: list[Request] = []
        exactly = _map(r).get("exactly")
        subs = _list(_map(r).get("firstAvailable"), 8)
        if isinstance(exactly, Mapping):
            got, problem = _request(f"{where}.exactly", exactly, name)
            if got is None:
                return ClaimAsk(ref, problem=problem)
            ways.append(got)
        for j, s in enumerate(subs):
            got, problem = _request(f"{where}.firstAvailable[{j}]", _map(s), name)
            if got is None:
                return ClaimAsk(ref, problem=problem)
            ways.append(got)
        if not ways:
            return ClaimAsk(ref, problem=f"{where} ({name}): neither exactly nor "
                                         "firstAvailable")
        requests.append((name, tuple(ways)))
    names = {n for n, _ in requests}
    same: set[str] = set()
    for c in _list(devices.get("constraints"), MAX_REQUESTS):
        if _map(c).get("matchAttribute") == NUMA_ATTRIBUTE:
            over = [str(x).partition("/")[0] for x in _list(_map(c).get("requests"),
                                                              MAX_REQUESTS)]
            same |= set(over) & names if over else names
    return ClaimAsk(ref, requests=tuple(requests), same_numa=frozenset(same))


def pod_claim_asks(pod: Mapping[str, Any], claims: Mapping[str, Mapping[str, Any]],
                   templates: Mapping[str, Mapping[str, Any]],
                   generated: Mapping[str, str] | None = None
                   ) -> tuple[list[ClaimAsk], list[str]]:
    """The pod's claims as asks; ``claims`` / ``templates``: the objects of the pod's
    namespace by name; ``generated``: the pod's claim name -> the claim generated for it
    (found by its owner: the pod's status may not say it yet). Problems reading the pod
    itself come second."""
    refs, problems = pod_claims(pod)
    out: list[ClaimAsk] = []
    for ref in refs:
        if ref.claim is None and generated and ref.name in generated:
            ref = PodClaim(ref.name, generated[ref.name], ref.template)
        obj = claims.get(ref.claim) if ref.claim else None
        if obj is not None:
            allocated, results, problem = allocation_results(obj)
            if allocated:
                fixed = []
                for r in results:
                    parts = [_str(r.get(k)) for k in ("request", "driver", "pool", "device")]
                    if all(parts):
                        req, drv, pool, dev = (str(p) for p in parts)
                        fixed.append((req.partition("/")[0], drv, pool, dev))
                out.append(ClaimAsk(ref, fixed=tuple(fixed), problem=problem and (
                    f"ResourceClaim {ref.claim}: {problem}")))
                continue
            out.append(claim_ask(ref, _map(obj.get("spec")), f"ResourceClaim {ref.claim}"))
            continue
        if ref.template is None:
            out.append(ClaimAsk(ref, problem=f"ResourceClaim {ref.claim} not found"))
            continue
        tpl = templates.get(ref.template)
        if tpl is None:
            out.append(ClaimAsk(ref, problem=f"ResourceClaimTemplate {ref.template} "
                                             "not found"))
            continue
        out.append(claim_ask(ref, _map(_map(tpl.get("spec")).get("spec")),
                             f"ResourceClaimTemplate {ref.template}"))
    return out, problems


# ---------------------------------------------------------------- choices


# one request's choice: (NUMA placements its devices are on, devices of unknown NUMA, count)
Placement = tuple[tuple[tuple[int, ...], ...], int, int]


@dataclass
class PodChoices:
    """The pod's device choices on one node: each maps (pod claim name, request) to a
    :data:`Placement`; ``peers``: per request, the NUMA nodes of the node's devices of
    its kind. ``refusal``: no choice at all (a claim that cannot be read, a class not
    found, too few devices), naming the claim; ``complete`` False: more choices than
    listed."""

    choices: list[dict[tuple[str, str], Placement]] = field(default_factory=list)
    peers: dict[tuple[str, str], tuple[NumaNodes, ...]] = field(default_factory=dict)
    refusal: str | None = None
    complete: bool = True

    def key(self) -> tuple[Any, ...]:
        """Everything the decision reads, hashable: nodes with equal keys (and equal
        machines and holdings) decide the pod alike."""
        return (self.refusal, self.complete,
                tuple(sorted(tuple(sorted(c.items())) for c in self.choices)),
                tuple(sorted(self.peers.items(), key=lambda kv: kv[0])))

    def choice_key(self, choice: Mapping[tuple[str, str], Placement]) -> Hashable:
        """What one choice's decision reads (its placements and their peers)."""
        return tuple(sorted((k, p, self.peers.get(k, ())) for k, p in choice.items()))

    def devices(self, pod: Mapping[str, Any], asks: Iterable[ClaimAsk],
                choice: Mapping[tuple[str, str], Placement]) -> PodDraDevices:
        """One choice as the claims' devices (stand-ins on the chosen NUMA nodes), in the
        form the node's admission reads (:meth:`PodDraDevices.requests`)."""
        out = PodDraDevices(containers=container_claims(pod))
        for ask in asks:
            devs: list[ClaimDevice] = []
            for (claim, request), (numa, unknown, count) in sorted(choice.items()):
                if claim != ask.claim.name:
                    continue
                kind = f"choice/{claim}/{request}"
                out.peers[kind] = self.peers.get((claim, request), ())
                spots: list[NumaNodes] = [*numa, *([None] * unknown)]
                spots += [numa[0]] * max(0, count - len(spots)) if numa else []
                for i, n in enumerate(spots):
                    d = ClaimDevice(request, "choice", f"{claim}.{request}", str(i), n)
                    out.kinds[d.id] = kind
                    devs.append(d)
            out.claims.append(ClaimState(ask.claim, True, tuple(devs)))
        return out


def _placements(cands: list[NodeDevice], count: int, out_of: list[bool]) -> list[Placement]:
    """The distinct placements of ``count`` devices among ``cands`` (``out_of`` gets
    False when they are too spread to list them all)."""
    groups: dict[tuple[int, ...], int] = {}
    unknown = 0
    for d in cands:
        if d.numa_nodes is None:
            unknown += 1
        else:
            groups[d.numa_nodes] = groups.get(d.numa_nodes, 0) + 1
    keys = sorted(groups)[:MAX_GROUPS]
    if len(groups) > MAX_GROUPS:
        out_of.append(False)
    out: list[Placement] = []
    for none in range(min(unknown, count) + 1):
        k = count - none
        if k == 0:
            out.append(((), none, count))
            continue
        for size in range(1, min(k, len(keys)) + 1):
            for sub in itertools.combinations(keys, size):
                if sum(groups[g] for g in sub) >= k:
                    out.append((sub, none, count))
    return out


def pod_choices(pod: Mapping[str, Any], asks: list[ClaimAsk],
                devices: Iterable[NodeDevice] | NodeOffer, in_use: Mapping[str, str],
                classes: Mapping[str, list[Selector] | None],
                problems: Iterable[str] = ()) -> PodChoices:
    """The pod's device choices on a node offering ``devices`` (``in_use``: device id ->
    the claim holding it, ``namespace/name``), given the DeviceClasses' selectors
    (``classes``: name -> selectors, None: not found)."""
    out = PodChoices()
    for p in problems:
        out.refusal = f"DRA: {p}"
        return out
    offer = devices if isinstance(devices, NodeOffer) else NodeOffer(devices)
    by_id = offer.by_id
    ns = str(_map(pod.get("metadata")).get("namespace") or "default")
    mine = {f"{ns}/{a.claim.claim}" for a in asks if a.claim.claim}

    def usable(d: NodeDevice, admin: bool) -> bool:
        held = in_use.get(d.id)
        return admin or d.shared or held is None or held in mine

    def candidates(way: Request) -> list[NodeDevice] | str:
        sel = classes.get(way.device_class)
        if sel is None:
            return f"DeviceClass {way.device_class} not found"
        return [d for d in offer.matching(way, sel) if usable(d, way.admin)]

    spread: list[bool] = []
    units: list[list[dict[tuple[str, str], Placement]]] = []
    for ask in asks:
        name = ask.claim.name
        if ask.problem and ask.fixed is None:
            out.refusal = f"DRA: claim {name}: {ask.problem}"
            return out
        if ask.fixed is not None:
            fixed: dict[tuple[str, str], list[NodeDevice | None]] = {}
            for req, drv, pool, dev in ask.fixed:
                fixed.setdefault((name, req), []).append(by_id.get(f"{drv}/{pool}/{dev}"))
            placed: dict[tuple[str, str], Placement] = {}
            for key, devs in fixed.items():
                known = tuple(sorted({d.numa_nodes for d in devs
                                      if d is not None and d.numa_nodes is not None}))
                placed[key] = (known, sum(1 for d in devs if d is None or d.numa_nodes is None),
                               len(devs))
                out.peers[key] = offer.peers(frozenset(d.kind for d in devs if d is not None))
            units.append([placed])
            continue
        free_units: list[dict[tuple[str, str], Placement]] = []
        per_request: dict[str, list[tuple[Request, list[NodeDevice]]]] = {}
        for req, ways in ask.requests:
            for way in ways:
                cands = candidates(way)
                if isinstance(cands, str):
                    out.refusal = f"DRA: claim {name} request {req}: {cands}"
                    return out
                per_request.setdefault(req, []).append((way, cands))
            out.peers[(name, req)] = offer.peers(frozenset(
                d.kind for _, cs in per_request.get(req, ()) for d in cs))
        # requests tied to one NUMA node: a choice per NUMA node (a device on several
        # NUMA nodes could join devices of any of them: then taken as not tied)
        tied = sorted(r for r in per_request if r in ask.same_numa)
        if any(d.numa_nodes is not None and len(d.numa_nodes) > 1
               for r in tied for _, cs in per_request[r] for d in cs):
            tied = []
        if tied:
            numas = sorted({n for r in tied for _, cs in per_request[r] for d in cs
                            if d.numa_attribute and d.numa_nodes for n in d.numa_nodes})
            for n in numas:
                choice: dict[tuple[str, str], Placement] = {}
                for r in tied:
                    for way, cs in per_request[r]:
                        on = [d for d in cs if d.numa_attribute and d.numa_nodes == (n,)]
                        want = way.count if way.count is not None else len(on)
                        if on and len(on) >= want:
                            choice[(name, r)] = (((n,),), 0, want)
                            break
                if len(choice) == len(tied):
                    free_units.append(choice)
            if not free_units:
                out.refusal = (f"DRA: claim {name}: requests {', '.join(tied)} cannot all "
                               f"be allocated on one NUMA node of this node")
                return out
            units.append(free_units)
        for r, found in sorted(per_request.items()):
            if r in tied:
                continue
            opts: list[dict[tuple[str, str], Placement]] = []
            for way, cs in found:
                count = way.count if way.count is not None else len(cs)
                if count == 0 or len(cs) < count:
                    continue
                if way.count is None:  # All: every candidate
                    opts.append({(name, r): (
                        tuple(sorted({d.numa_nodes for d in cs if d.numa_nodes is not None})),
                        sum(1 for d in cs if d.numa_nodes is None), count)})
                else:
                    opts.extend({(name, r): p} for p in _placements(cs, count, spread))
            if not opts:
                asked = "; ".join(f"{w.count or 'all'} of class {w.device_class}"
                                  for w, _ in found)
                out.refusal = (f"DRA: claim {name} request {r}: this node has not enough "
                               f"free devices ({asked})")
                return out
            seen: list[dict[tuple[str, str], Placement]] = []
            for o in opts:
                if o not in seen:
                    seen.append(o)
            units.append(seen)
    out.complete = not spread
    for combo in itertools.product(*units):
        if len(out.choices) >= MAX_CHOICES:
            out.complete = False
            break
        merged: dict[tuple[str, str], Placement] = {}
        for part in combo:
            merged.update(part)
        out.choices.append(merged)
    return out


__all__ = ["MAX_CHOICES", "NUMA_ATTRIBUTE", "ClaimAsk", "NodeDevice", "NodeOffer", "Placement",
           "PodChoices", "Request", "Selector", "claim_ask", "device_attributes",
           "parse_selector", "pod_choices", "pod_claim_asks", "selectors_of"]
