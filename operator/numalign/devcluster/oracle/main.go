// Command kubelet-oracle admits a sequence of pods with the kubelet's own admission code
// and prints one JSON line per pod in the shape of `numalign admit`.
//
// It links the kubelet's packages (no copy of their logic): the Topology Manager
// (topologymanager.NewManager) with the CPU manager's static policy
// (cpumanager.NewStaticPolicy over topology.Discover and state.NewMemoryState) and the
// memory manager's static policy (memorymanager.NewPolicyStatic over its in-memory state)
// as hint providers, then the predicate admit handler (lifecycle.NewPredicateAdmitHandler,
// the scheduler's resource fit as the kubelet runs it). The handlers run in the kubelet's
// order (Topology Manager, then the predicate handler); what a rejected pod was given is
// released before the next pod, as the managers' removeStaleState does.
//
// Not linked: the device manager (it only runs as a gRPC server with plugins under
// /var/lib/kubelet); pods asking for devices are not given to this oracle.
//
// Input (stdin, JSON):
//
//	{"machine": cadvisor MachineInfo, "allocatable": {RESOURCE: QUANTITY},
//	 "policy": P, "scope": S, "options": {K: V}, "pods": [core/v1 Pod, ...]}
//
// Output: one line per pod,
//
//	{"pod", "admit", "reason", "message", "containers": {NAME: {"cpus", "memoryNumaNodes",
//	 "memory": {TYPE: bytes}}}, "insufficient": [RESOURCE, ...], "stateChanged": bool}
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"reflect"
	"sort"

	"github.com/go-logr/logr"
	cadvisorapi "github.com/google/cadvisor/lib/model"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/cpumanager"
	cpustate "k8s.io/kubernetes/pkg/kubelet/cm/cpumanager/state"
	"k8s.io/kubernetes/pkg/kubelet/cm/cpumanager/topology"
	"k8s.io/kubernetes/pkg/kubelet/cm/memorymanager"
	memstate "k8s.io/kubernetes/pkg/kubelet/cm/memorymanager/state"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	"k8s.io/kubernetes/pkg/scheduler"
	schedulerframework "k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/cpuset"
)

// The memory manager's static policy refuses to start without reserved memory; the
// oracle adds this much to the first NUMA node and reserves it there, so what is
// allocatable per node is exactly the machine file's memory.
const reservedPad = 1 << 20

type input struct {
	Machine     cadvisorapi.MachineInfo `json:"machine"`
	Allocatable v1.ResourceList         `json:"allocatable"`
	Policy      string                  `json:"policy"`
	Scope       string                  `json:"scope"`
	Options     map[string]string       `json:"options"`
	Pods        []v1.Pod                `json:"pods"`
}

type containerOut struct {
	CPUs            []int             `json:"cpus"`
	MemoryNumaNodes []int             `json:"memoryNumaNodes"`
	Memory          map[string]uint64 `json:"memory"`
}

type podOut struct {
	Pod          string                  `json:"pod"`
	Admit        bool                    `json:"admit"`
	Reason       *string                 `json:"reason"`
	Message      *string                 `json:"message"`
	Containers   map[string]containerOut `json:"containers"`
	Insufficient []string                `json:"insufficient"`
	// The memory manager's state after the rejected pod was released is not the state
	// before it (its release frees a block's bytes from the first nodes of the block's
	// affinity and keeps a node's group until the node has no assignment left).
	StateChanged bool `json:"stateChanged"`
}

// cpuProvider and memProvider are what the CPU and memory managers are to the Topology
// Manager, without their reconcile loops and checkpoint files: the policy over its state.
type cpuProvider struct {
	policy cpumanager.Policy
	state  cpustate.State
	log    klog.Logger
}

func (p *cpuProvider) GetTopologyHints(_ klog.Logger, pod *v1.Pod, c *v1.Container, op lifecycle.Operation) map[string][]topologymanager.TopologyHint {
	return p.policy.GetTopologyHints(p.log, p.state, pod, c, op)
}

func (p *cpuProvider) GetPodTopologyHints(_ klog.Logger, pod *v1.Pod, op lifecycle.Operation) map[string][]topologymanager.TopologyHint {
	return p.policy.GetPodTopologyHints(p.log, p.state, pod, op)
}

func (p *cpuProvider) AllocatePod(_ klog.Logger, pod *v1.Pod, op lifecycle.Operation) error {
	return p.policy.AllocatePod(p.log, p.state, pod, op)
}

func (p *cpuProvider) Allocate(_ context.Context, pod *v1.Pod, c *v1.Container, op lifecycle.Operation) error {
	return p.policy.Allocate(p.log, p.state, pod, c, op)
}

type memProvider struct {
	policy memorymanager.Policy
	state  memstate.State
	log    klog.Logger
}

func (p *memProvider) GetTopologyHints(_ klog.Logger, pod *v1.Pod, c *v1.Container, op lifecycle.Operation) map[string][]topologymanager.TopologyHint {
	return p.policy.GetTopologyHints(p.log, p.state, pod, c, op)
}

func (p *memProvider) GetPodTopologyHints(_ klog.Logger, pod *v1.Pod, op lifecycle.Operation) map[string][]topologymanager.TopologyHint {
	return p.policy.GetPodTopologyHints(p.log, p.state, pod, op)
}

func (p *memProvider) AllocatePod(_ klog.Logger, pod *v1.Pod, op lifecycle.Operation) error {
	return p.policy.AllocatePod(p.log, p.state, pod, op)
}

func (p *memProvider) Allocate(ctx context.Context, pod *v1.Pod, c *v1.Container, op lifecycle.Operation) error {
	return p.policy.Allocate(ctx, p.state, pod, c, op)
}

// storeProxy lets the policies ask the Topology Manager (created after them) for affinities.
type storeProxy struct{ tm topologymanager.Manager }

func (s *storeProxy) GetAffinity(l klog.Logger, uid, name string) topologymanager.TopologyHint {
	return s.tm.GetAffinity(l, uid, name)
}
func (s *storeProxy) GetPolicy() topologymanager.Policy { return s.tm.GetPolicy() }
func (s *storeProxy) Name() string                      { return s.tm.Name() }

type noRecovery struct{}

func (noRecovery) HandleAdmissionFailure(_ context.Context, _ *v1.Pod, reasons []lifecycle.PredicateFailureReason, _ lifecycle.Operation) ([]lifecycle.PredicateFailureReason, error) {
	return reasons, nil
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kubelet-oracle: "+format+"\n", args...)
	os.Exit(2)
}

func main() {
	raw, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail("reading stdin: %v", err)
	}
	var in input
	if err := json.Unmarshal(raw, &in); err != nil {
		fail("input: %v", err)
	}
	log := logr.Discard()
	ctx := klog.NewContext(context.Background(), log)

	machine := in.Machine
	if len(machine.Topology) == 0 {
		fail("machine.topology: no NUMA nodes")
	}
	machine.Topology = append([]cadvisorapi.Node(nil), machine.Topology...)
	machine.Topology[0].Memory += reservedPad

	store := &storeProxy{}
	cpuTopo, err := topology.Discover(log, &machine)
	if err != nil {
		fail("topology.Discover: %v", err)
	}
	cpuPolicy, err := cpumanager.NewStaticPolicy(log, cpuTopo, 0, cpuset.New(), store, nil)
	if err != nil {
		fail("cpu manager: %v", err)
	}
	cpuState := cpustate.NewMemoryState(log)
	if err := cpuPolicy.Start(log, cpuState); err != nil {
		fail("cpu manager start: %v", err)
	}
	reserved := map[int]map[v1.ResourceName]uint64{}
	for _, n := range machine.Topology {
		reserved[n.Id] = map[v1.ResourceName]uint64{}
	}
	reserved[machine.Topology[0].Id][v1.ResourceMemory] = reservedPad
	memPolicy, err := memorymanager.NewPolicyStatic(log, &machine, reserved, store)
	if err != nil {
		fail("memory manager: %v", err)
	}
	memState := memstate.NewMemoryState(log)
	if err := memPolicy.Start(log, memState); err != nil {
		fail("memory manager start: %v", err)
	}

	tm, err := topologymanager.NewManager(log, in.Machine.Topology, in.Policy, in.Scope, in.Options)
	if err != nil {
		fail("topology manager: %v", err)
	}
	store.tm = tm
	tm.AddHintProvider(log, &cpuProvider{cpuPolicy, cpuState, log})
	tm.AddHintProvider(log, &memProvider{memPolicy, memState, log})

	node := &v1.Node{}
	node.Name = "oracle"
	node.Labels = map[string]string{v1.LabelOSStable: "linux", v1.LabelHostname: "oracle"}
	node.Status.Capacity = in.Allocatable
	node.Status.Allocatable = in.Allocatable
	getNode := func(context.Context, bool) (*v1.Node, error) { return node, nil }
	noUpdate := func(*schedulerframework.NodeInfo, *lifecycle.PodAdmitAttributes) error { return nil }
	predicate := lifecycle.NewPredicateAdmitHandler(getNode, noRecovery{}, noUpdate)

	release := func(pod *v1.Pod) {
		uid := string(pod.UID)
		for _, c := range append(append([]v1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...) {
			_ = cpuPolicy.RemoveContainer(log, cpuState, uid, c.Name)
			memPolicy.RemoveContainer(log, memState, uid, c.Name)
		}
	}

	var active []*v1.Pod
	enc := json.NewEncoder(os.Stdout)
	for i := range in.Pods {
		pod := in.Pods[i].DeepCopy()
		if pod.Namespace == "" {
			pod.Namespace = "default"
		}
		if pod.UID == "" {
			pod.UID = types.UID(pod.Namespace + "/" + pod.Name)
		}
		before := memState.GetMachineState()
		attrs := &lifecycle.PodAdmitAttributes{Pod: pod, OtherPods: active, Operation: lifecycle.AddOperation}
		result := tm.Admit(ctx, attrs)
		if result.Admit {
			result = predicate.Admit(ctx, attrs)
		}
		out := podOut{Pod: pod.Name, Admit: result.Admit, Containers: map[string]containerOut{}, Insufficient: []string{}}
		if !result.Admit {
			out.Reason, out.Message = &result.Reason, &result.Message
			// Every resource the fit check finds short (the kubelet reports the first,
			// and the order of extended resources is a map's).
			info := schedulerframework.NewNodeInfo(active...)
			info.SetNode(node)
			for _, r := range scheduler.AdmissionCheck(pod, info, true) {
				if r.InsufficientResource != nil {
					out.Insufficient = append(out.Insufficient, string(r.InsufficientResource.ResourceName))
				}
			}
			sort.Strings(out.Insufficient)
			release(pod)
			out.StateChanged = !reflect.DeepEqual(before, memState.GetMachineState())
		} else {
			active = append(active, pod)
			uid := string(pod.UID)
			for _, c := range append(append([]v1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...) {
				co := containerOut{CPUs: []int{}, MemoryNumaNodes: []int{}, Memory: map[string]uint64{}}
				if set, ok := cpuState.GetCPUSet(uid, c.Name); ok {
					co.CPUs = set.List()
				}
				nodes := map[int]bool{}
				for _, b := range memState.GetMemoryBlocks(uid, c.Name) {
					for _, n := range b.NUMAAffinity {
						nodes[n] = true
					}
					co.Memory[string(b.Type)] += b.Size
				}
				for n := range nodes {
					co.MemoryNumaNodes = append(co.MemoryNumaNodes, n)
				}
				sort.Ints(co.MemoryNumaNodes)
				out.Containers[c.Name] = co
			}
		}
		if err := enc.Encode(out); err != nil {
			fail("writing: %v", err)
		}
	}
}
