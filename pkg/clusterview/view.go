// Package clusterview is what `kubectl vgpu` shows: every GPU a vGPU driver publishes, what the
// allocated claims take of it and who holds the shares, built from the API server alone
// (ResourceSlices, ResourceClaims with their allocations' consumed capacity and the device
// status the node plugins wrote, pods) — no node
// access, no plugin endpoint. It works for any cluster where the driver runs, with the
// permissions to list those objects.
package clusterview

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// GPU is one published device with what the allocated claims take of it.
type GPU struct {
	Node    string `json:"node"`
	Pool    string `json:"pool"`
	Device  string `json:"device"`
	UUID    string `json:"uuid,omitempty"`
	Product string `json:"productName,omitempty"`
	Memory  Amount `json:"memory"`
	Cores   Amount `json:"cores"`
	// Health is "Healthy", or the reason of the driver's unhealthy taint.
	Health string  `json:"health"`
	Shares []Share `json:"shares"`
	// MIGProfile is set on a MIG partition (contract §18), e.g. "1g.18gb"; UUID is then its
	// GPU's. Partitions are listed only while a claim holds them, and a GPU with one has nothing
	// free for a share of the whole GPU.
	MIGProfile string `json:"migProfile,omitempty"`
}

// Amount is a capacity: published in the ResourceSlice, allocated to claims, and what is left.
// Memory in bytes, cores in percent of the GPU's SMs.
type Amount struct {
	Published int64 `json:"published"`
	Allocated int64 `json:"allocated"`
	Free      int64 `json:"free"`
}

// Share is one allocation result on a GPU: one request of one claim.
type Share struct {
	Namespace string `json:"namespace"`
	Claim     string `json:"claim"`
	Request   string `json:"request"`
	ShareID   string `json:"shareID,omitempty"`
	Memory    int64  `json:"memory"`
	Cores     int64  `json:"cores"`
	// Class and CoresCeiling are the share's compute class and burst ceiling as the node's
	// plugin wrote them into the claim's device status (contract §3): empty before it wrote
	// them, and for a share without a core limit.
	Class        string `json:"class,omitempty"`
	CoresCeiling int64  `json:"coresCeiling,omitempty"`
	// Pods are the pods the claim is reserved for.
	Pods []string `json:"pods"`
}

// PodShare is one share a pod holds: a result of one of its claims on one GPU.
type PodShare struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Claim     string `json:"claim"`
	Request   string `json:"request"`
	Node      string `json:"node"`
	Device    string `json:"device"`
	UUID      string `json:"uuid,omitempty"`
	Memory    int64  `json:"memory"`
	Cores     int64  `json:"cores"`
	// Class and CoresCeiling are as in Share.
	Class        string `json:"class,omitempty"`
	CoresCeiling int64  `json:"coresCeiling,omitempty"`
	// Containers are the pod's containers that use the claim.
	Containers []string `json:"containers"`
}

// Reader reads the cluster through client-go.
type Reader struct {
	Client kubernetes.Interface
	// Driver is the DRA driver whose devices are shown (contract.DefaultDriverName).
	Driver string
}

type deviceKey struct{ pool, device string }

// GPUs returns every device of the driver, ordered by node and device name, with the shares
// of every allocated claim in the cluster; MIG partitions only while a claim holds them.
func (r Reader) GPUs(ctx context.Context) ([]GPU, error) {
	gpus, err := r.devices(ctx)
	if err != nil {
		return nil, err
	}
	claims, err := r.Client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceClaims: %w", err)
	}
	for i := range claims.Items {
		c := &claims.Items[i]
		for _, res := range r.results(c) {
			g, ok := gpus[deviceKey{res.Pool, res.Device}]
			if !ok {
				continue // allocated on a device no slice publishes any more
			}
			s := share(c, res, g)
			g.Shares = append(g.Shares, s)
			g.Memory.Allocated += s.Memory
			g.Cores.Allocated += s.Cores
		}
	}
	partitioned := map[string]bool{} // node/GPU UUID
	for k, g := range gpus {
		switch {
		case g.MIGProfile == "":
		case len(g.Shares) == 0:
			delete(gpus, k) // 28 partitions an H200: only those held tell anything
		default:
			partitioned[g.Node+"/"+g.UUID] = true
		}
	}
	out := make([]GPU, 0, len(gpus))
	for _, g := range gpus {
		g.Memory.Free = max(g.Memory.Published-g.Memory.Allocated, 0)
		g.Cores.Free = max(g.Cores.Published-g.Cores.Allocated, 0)
		if g.MIGProfile == "" && partitioned[g.Node+"/"+g.UUID] {
			g.Memory.Free, g.Cores.Free = 0, 0
		}
		slices.SortFunc(g.Shares, func(a, b Share) int {
			return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Claim, b.Claim), cmp.Compare(a.Request, b.Request))
		})
		if g.Shares == nil {
			g.Shares = []Share{}
		}
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b GPU) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(len(a.Device), len(b.Device)), cmp.Compare(a.Device, b.Device))
	})
	return out, nil
}

// Pods returns the shares of the pods in namespace (metav1.NamespaceAll: every namespace),
// ordered by namespace, pod, claim and request. Pods without a claim of the driver are left out.
func (r Reader) Pods(ctx context.Context, namespace string) ([]PodShare, error) {
	pods, err := r.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	claimList, err := r.Client.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceClaims: %w", err)
	}
	claims := map[[2]string]*resourceapi.ResourceClaim{}
	for i := range claimList.Items {
		c := &claimList.Items[i]
		claims[[2]string{c.Namespace, c.Name}] = c
	}
	gpus, err := r.devices(ctx)
	if err != nil {
		return nil, err
	}
	var out []PodShare
	for i := range pods.Items {
		p := &pods.Items[i]
		for podClaim, name := range claimNames(p) {
			c, ok := claims[[2]string{p.Namespace, name}]
			if !ok {
				continue
			}
			for _, res := range r.results(c) {
				g := gpus[deviceKey{res.Pool, res.Device}]
				s := share(c, res, g)
				ps := PodShare{Namespace: p.Namespace, Pod: p.Name, Claim: c.Name, Request: res.Request, Device: res.Device,
					Memory: s.Memory, Cores: s.Cores, Class: s.Class, CoresCeiling: s.CoresCeiling,
					Node: p.Spec.NodeName, Containers: containersUsing(p, podClaim)}
				if g != nil {
					ps.UUID, ps.Node = g.UUID, cmp.Or(g.Node, ps.Node)
				}
				out = append(out, ps)
			}
		}
	}
	slices.SortFunc(out, func(a, b PodShare) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.Claim, b.Claim), cmp.Compare(a.Request, b.Request))
	})
	if out == nil {
		out = []PodShare{}
	}
	return out, nil
}

// devices reads the driver's ResourceSlices.
func (r Reader) devices(ctx context.Context) (map[deviceKey]*GPU, error) {
	slicesList, err := r.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + r.Driver})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices of driver %s: %w", r.Driver, err)
	}
	out := map[deviceKey]*GPU{}
	for _, s := range slicesList.Items {
		if s.Spec.Driver != r.Driver {
			continue
		}
		node := s.Spec.Pool.Name
		if s.Spec.NodeName != nil && *s.Spec.NodeName != "" {
			node = *s.Spec.NodeName
		}
		for _, d := range s.Spec.Devices {
			g := &GPU{Node: node, Pool: s.Spec.Pool.Name, Device: d.Name, Health: "Healthy",
				UUID: cmp.Or(stringAttr(d, "uuid"), stringAttr(d, "parentUUID")), Product: stringAttr(d, "productName"),
				MIGProfile: stringAttr(d, "migProfile")}
			if c, ok := d.Capacity[contract.CapacityMemory]; ok {
				g.Memory.Published = c.Value.Value()
			}
			if c, ok := d.Capacity[contract.CapacityCores]; ok {
				g.Cores.Published = c.Value.Value()
			}
			for _, t := range d.Taints {
				if t.Key == r.Driver+"/"+contract.UnhealthyTaintKeySuffix {
					g.Health = "Unhealthy"
					if t.Value != "" {
						g.Health += ": " + t.Value
					}
				}
			}
			out[deviceKey{g.Pool, g.Device}] = g
		}
	}
	return out, nil
}

// results are the claim's allocation results of the driver.
func (r Reader) results(c *resourceapi.ResourceClaim) []resourceapi.DeviceRequestAllocationResult {
	if c.Status.Allocation == nil {
		return nil
	}
	var out []resourceapi.DeviceRequestAllocationResult
	for _, res := range c.Status.Allocation.Devices.Results {
		if res.Driver == r.Driver {
			out = append(out, res)
		}
	}
	return out
}

// share is what one result takes of its GPU: its consumed capacity, the whole GPU where it has
// none (an exclusive allocation, or a driver that does not publish consumable capacity).
func share(c *resourceapi.ResourceClaim, res resourceapi.DeviceRequestAllocationResult, g *GPU) Share {
	s := Share{Namespace: c.Namespace, Claim: c.Name, Request: res.Request, Pods: []string{}}
	if res.ShareID != nil {
		s.ShareID = string(*res.ShareID)
	}
	if g != nil {
		s.Memory, s.Cores = g.Memory.Published, g.Cores.Published
	}
	if q, ok := res.ConsumedCapacity[contract.CapacityMemory]; ok {
		s.Memory = q.Value()
	}
	if q, ok := res.ConsumedCapacity[contract.CapacityCores]; ok {
		s.Cores = q.Value()
	}
	s.Class, s.CoresCeiling = computeTerms(c, res)
	for _, ref := range c.Status.ReservedFor {
		if ref.Resource == "pods" && ref.APIGroup == "" {
			s.Pods = append(s.Pods, ref.Name)
		}
	}
	slices.Sort(s.Pods)
	return s
}

// computeTerms are the class and burst ceiling the node's plugin wrote for the result into the
// claim's device status (the entry with the result's driver, pool, device and share ID,
// contract §3 "Claim device status"); none while there is no such entry, when its data does
// not decode, and for a result without a core limit.
func computeTerms(c *resourceapi.ResourceClaim, res resourceapi.DeviceRequestAllocationResult) (class string, ceiling int64) {
	shareID := ""
	if res.ShareID != nil {
		shareID = string(*res.ShareID)
	}
	for _, st := range c.Status.Devices {
		if st.Driver != res.Driver || st.Pool != res.Pool || st.Device != res.Device || ptr.Deref(st.ShareID, "") != shareID {
			continue
		}
		var data contract.DeviceStatusData
		if st.Data == nil || json.Unmarshal(st.Data.Raw, &data) != nil {
			return "", 0
		}
		return data.Class, data.CoresCeiling
	}
	return "", 0
}

// claimNames maps each of the pod's claim references to the ResourceClaim's name: the one it
// names, or the one generated from its template (the pod's status says which).
func claimNames(p *corev1.Pod) map[string]string {
	out := map[string]string{}
	for _, rc := range p.Spec.ResourceClaims {
		if rc.ResourceClaimName != nil {
			out[rc.Name] = *rc.ResourceClaimName
		}
	}
	for _, st := range p.Status.ResourceClaimStatuses {
		if st.ResourceClaimName != nil {
			out[st.Name] = *st.ResourceClaimName
		}
	}
	return out
}

// containersUsing lists the pod's containers (init containers too) that reference the claim.
func containersUsing(p *corev1.Pod, podClaim string) []string {
	out := []string{}
	for _, list := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for _, ctr := range list {
			if slices.ContainsFunc(ctr.Resources.Claims, func(c corev1.ResourceClaim) bool { return c.Name == podClaim }) {
				out = append(out, ctr.Name)
			}
		}
	}
	return out
}

func stringAttr(d resourceapi.Device, name resourceapi.QualifiedName) string {
	if a, ok := d.Attributes[name]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}
