"""Every name numalign puts on the API server, in one place: annotation, label, finalizer
and scheduling-gate names, the reasons of the Events it posts, the rejection reason and
message (the kubelet's own, where it has a constant), the ``source`` values of a resolved
policy and the name the agent registers with the runtime's NRI."""

from __future__ import annotations

from numalign.topology.gpu.requests import ANNOTATION as GPU_ANNOTATION

# The kubelet's rejection reason and message (the engine's constants): the Topology
# Manager's TopologyAffinityError, its Type() and Error() (pkg/kubelet/cm/topologymanager),
# with the prefix of the kubelet's rejectPod.
from numalign.topology.merge import REJECT_MESSAGE as REJECT_MESSAGE
from numalign.topology.merge import REJECT_REASON as REJECT_REASON

# ---------------------------------------------------------------- pods

ANN_POLICY = "numalign.io/policy"  # user: policy override
ANN_SCOPE = "numalign.io/scope"  # user: scope override
ANN_RESOLVED = "numalign.io/resolved"  # operator: the resolved policy
ANN_ALLOCATION = "numalign.io/allocation"  # agent: what the pod got
ANN_REJECTION = "numalign.io/rejection"  # agent (NRI-managed node): why it refused the pod
# pod: may run where numalign's NRI plugin is not registered (the runtime's NRI
# `tolerate_missing_plugins_annotation` on nodes that require the plugin)
ANN_TOLERATE_UNPLACED = "numalign.io/tolerate-unplaced"
ANN_GPUS = GPU_ANNOTATION  # user: GPU requests (the engine reads it)
ANN_OVERRIDE_WARNED = "numalign.io/override-warning"  # operator: a bad override was reported

# The redeploy of rejected pods (controller.redeploy).
ANN_REDEPLOY_OF = "numalign.io/redeploy-of"  # replacement pod: the rejected pod's name
ANN_REDEPLOY_OF_UID = "numalign.io/redeploy-of-uid"  # replacement pod: ... and its uid
ANN_REDEPLOY_BASE = "numalign.io/redeploy-base"  # replacement pod: the first one's name
ANN_WORKLOAD = "numalign.io/workload"  # operator, at creation: the pod's workload
# user, on a workload's controller: a new value releases its spent redeploy budget
ANN_REDEPLOY_RESET = "numalign.io/redeploy-reset"
REDEPLOY_GATE = "numalign.io/redeploy"  # the scheduling gate holding a workload's new pods

# ---------------------------------------------------------------- nodes and objects

LABEL_MACHINE = "numalign.io/machine"  # node: its machine file
LABEL_EMULATED = "numalign.io/emulated"  # node: run by the emulating agent
# node: numalign places its containers through the runtime's NRI (the kubelet's CPU, memory
# and Topology managers at `none`); the value names the mechanism.
LABEL_MANAGED = "numalign.io/managed"
MANAGED_NRI = "nri"
LABEL_STATE = "numalign.io/state"  # ConfigMap: the redeploy records (value "redeploy")
FINALIZER = "numalign.io/operator"  # Kopf's, on the objects the operator handles
NRI_PLUGIN_NAME = "numalign"  # the name the agent registers with the runtime's NRI

# ---------------------------------------------------------------- reasons

# The kubelet's rejection: reason, and the message (the engine's; the status message
# carries the prefix, the kubelet's rejectPod "Pod was rejected: ", the event's text is
# the same).
REJECTED_PREFIX = "Pod was rejected: "
TOPOLOGY_MESSAGE = REJECT_MESSAGE.removeprefix(REJECTED_PREFIX)

# The reasons of the Events numalign posts (the rejection's is the kubelet's, above).
EVENT_REDEPLOY = "Redeploy"  # operator: a rejected pod deleted (or recreated)
EVENT_REDEPLOY_GAVE_UP = "RedeployGaveUp"  # operator: a rejected pod stays Failed
EVENT_REDEPLOY_REPEAT = "RedeployRepeat"  # operator: a repeat deleted, no attempt spent
EVENT_REDEPLOY_EXHAUSTED = "RedeployExhausted"  # operator: held, the budget is spent
EVENT_REDEPLOY_BACKOFF = "RedeployBackoff"  # operator: held during a backoff
EVENT_REDEPLOY_RELEASED = "RedeployReleased"  # operator: the scheduling gate removed
EVENT_INVALID_OVERRIDE = "InvalidTopologyOverride"  # operator: a bad pod override ignored
EVENT_INVALID_POLICY = "InvalidTopologyPolicy"  # agent: a resolved policy it cannot use
EVENT_INVALID_GPU = "InvalidGpuRequest"  # agent: a bad GPU request (pod status reason too)
# extender: no allocation of the pod's claims can be made or checked on a node
DRA_UNSATISFIABLE_REASON = "DRAClaimsUnsatisfiable"
# the extender's refusal of a node where pods in flight (claims not allocated yet) may
# land in more ways than it checks, under a policy that must hold for every one
IN_FLIGHT_REASON = "PodsInFlightUnchecked"
# webhook: the claim constraint that keeps a claim's devices on one NUMA node
DRA_NUMA_CONSTRAINT_WEBHOOK = "numa-constraint"

# ---------------------------------------------------------------- sources

# Where a resolved policy came from (``numalign.io/resolved``'s ``source``).
SOURCE_POD = "pod"
SOURCE_NODE_DEFAULT = "node-default"
SOURCE_NONE = "none"
SOURCE_POLICY_PREFIX = "TopologyPolicy/"
# A kubelet-managed node's own policy (never in the annotation): NodeTopology.spec.source
# on a kubelet-managed real node, the policy is its kubelet's.
SOURCE_KUBELET = "kubelet"
