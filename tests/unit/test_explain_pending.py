"""`numalign explain` on a Pending pod, without a cluster: the extender's verdict on every
node with a NodeTopology (bound pods held), rendered, and the scheduler's last word."""

from __future__ import annotations

from test_extender_decide import node, pod, published
from test_extender_fleet import bound

from numalign.commands import explain_pending as pending


def test_pending_pod_node_by_node() -> None:
    small, big = node("fragmented-8numa", "small"), node("dual-16core", "big")
    six = pod("six", {"cpu": "6", "memory": "1Gi"})
    # two 6-CPU pods bound to big, not published yet: big has room for two more
    held = [bound(pod(f"h{i}", {"cpu": "6", "memory": "1Gi"}), "big") for i in range(2)]
    verdicts = pending.pending_verdicts(six, [published(small, 1), published(big, 1)], held)
    events = [{"reason": "Scheduled", "message": "old", "lastTimestamp": "2026-01-01T00:00:09Z"},
              {"reason": "FailedScheduling", "message": "0/2 nodes: first",
               "lastTimestamp": "2026-01-01T00:00:01Z"},
              {"reason": "FailedScheduling", "message": "0/2 nodes: latest",
               "lastTimestamp": "2026-01-01T00:00:05Z"}]
    doc = pending.pending_json("six", "default", verdicts,
                               pending.last_failed_scheduling(events))
    assert doc["fits"] == ["big"] and list(doc["refused"]) == ["small"]
    assert doc["scheduler"] == "0/2 nodes: latest"
    text = pending.render_pending(doc)
    assert "Pod default/six: not bound to a node yet" in text
    assert "The scheduler said: 0/2 nodes: latest" in text
    assert "(1 fit, 1 refused)" in text
    assert "small  refused: TopologyAffinityError: Resources cannot be allocated" in text
    assert "big    fits: NUMA nodes [1], score 10/10" in text  # NUMA node 0 is held
    # with four bound there, big is full too
    more = [*held, *(bound(pod(f"h{i}", {"cpu": "6", "memory": "1Gi"}), "big")
                     for i in range(2, 4))]
    verdicts = pending.pending_verdicts(six, [published(small, 1), published(big, 1)], more)
    assert not any(v.fits for v in verdicts)
    assert "No node has a NodeTopology" in pending.render_pending(
        pending.pending_json("six", "default", [], None))
