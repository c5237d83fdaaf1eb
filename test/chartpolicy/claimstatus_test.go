package chartpolicy

import (
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
)

const (
	driver      = "vgpu.dra.dev" // values.yaml's driverName
	otherDriver = "nic.example.com"
	node        = "node-a"
	otherNode   = "node-b"
)

// TestClaimStatusOwnNode: the chart's policy <release>-claim-status-own-node lets the plugin of
// a node add, change and remove its own pool's entries of status.devices on a claim allocated
// devices of that pool, and nothing else: an entry of another node's pool or of another driver
// may be neither added, nor changed, nor removed, while such entries left as they are do not
// stand in the way of its own.
func TestClaimStatusOwnNode(t *testing.T) {
	e := compile(t, policy(t, "node-restriction-policy.yaml", "-claim-status-own-node"))
	own := entry(driver, node, "gpu-0", "Prepared")
	ownChanged := entry(driver, node, "gpu-0", "Unhealthy")
	neighbour := entry(driver, otherNode, "gpu-0", "Prepared")
	nic := entry(otherDriver, node, "eth1", "Prepared")
	const ownNodeOnly = "may only write the device status of its own node's devices"
	const unchanged = "may not change or remove the device status that another node's plugin or another driver wrote"

	for _, tc := range []struct {
		name     string
		old, new []resourceapi.AllocatedDeviceStatus
		allocOn  string // the pool the claim is allocated a device of
		caller   user.Info
		denial   string // "" when admitted
	}{
		{name: "own entry added", new: list(own)},
		{name: "own entry changed", old: list(own), new: list(ownChanged)},
		{name: "own entry removed", old: list(own)},
		{name: "own entry changed next to others left alone", old: list(own, neighbour, nic), new: list(nic, ownChanged, neighbour)},
		{name: "another node's entry added", new: list(own, neighbour), denial: ownNodeOnly + ", not of pool " + otherNode},
		{name: "another node's entry removed", old: list(own, neighbour), new: list(own), denial: unchanged},
		{name: "another node's entry changed", old: list(neighbour), new: list(entry(driver, otherNode, "gpu-0", "Unhealthy")), denial: ownNodeOnly},
		{name: "another driver's entry removed", old: list(own, nic), new: list(ownChanged), denial: unchanged},
		{name: "another driver's entry changed", old: list(nic), new: list(entry(otherDriver, node, "eth1", "Unhealthy")), denial: ownNodeOnly},
		{name: "own entry on a claim allocated elsewhere", new: list(own), allocOn: otherNode, denial: "may only write the device status of claims allocated devices of its node"},
		{name: "a token without a node", new: list(own), caller: pluginUser(""), denial: "carries no node name"},
		{name: "another user", old: list(neighbour), caller: &user.DefaultInfo{Name: "system:serviceaccount:kube-system:resourceclaim-controller"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			allocOn, caller := tc.allocOn, tc.caller
			if allocOn == "" {
				allocOn = node
			}
			if caller == nil {
				caller = pluginUser(node)
			}
			old := claim(allocOn, tc.old)
			denial, matched := e.denial(t, request{
				operation: admission.Update, resource: resourceapi.SchemeGroupVersion.WithResource("resourceclaims"), subresource: "status",
				kind: resourceapi.SchemeGroupVersion.WithKind("ResourceClaim"), namespace: old.Namespace, name: old.Name,
				object: claim(allocOn, tc.new), old: old, user: caller,
			})
			if plugin := tc.caller == nil || strings.HasSuffix(tc.caller.GetName(), "-kubelet-plugin"); matched != plugin {
				t.Errorf("the policy selected the request: %v, want %v (the plugin's requests only)", matched, plugin)
			}
			if tc.denial == "" && denial != "" || tc.denial != "" && !strings.Contains(denial, tc.denial) {
				t.Errorf("denial %q, want %q", denial, tc.denial)
			}
		})
	}
}

func pluginUser(node string) user.Info {
	u := &user.DefaultInfo{Name: "system:serviceaccount:" + releaseNamespace + ":" + releaseName + "-kubelet-plugin",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + releaseNamespace, "system:authenticated"}}
	if node != "" {
		u.Extra = map[string][]string{"authentication.kubernetes.io/node-name": {node}}
	}
	return u
}

func entry(driver, pool, device, reason string) resourceapi.AllocatedDeviceStatus {
	return resourceapi.AllocatedDeviceStatus{Driver: driver, Pool: pool, Device: device, Conditions: []metav1.Condition{{
		Type: "Ready", Status: metav1.ConditionTrue, Reason: reason, Message: "test",
		LastTransitionTime: metav1.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}}}
}

func list(entries ...resourceapi.AllocatedDeviceStatus) []resourceapi.AllocatedDeviceStatus {
	return entries
}

// claim is a claim allocated device gpu-0 of pool (and a NIC of another driver on the same
// node), with the device status entries given.
func claim(pool string, devices []resourceapi.AllocatedDeviceStatus) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: "share", Namespace: "tenant", UID: "uid-1"},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "gpu", Driver: driver, Pool: pool, Device: "gpu-0"},
				{Request: "nic", Driver: otherDriver, Pool: node, Device: "eth1"},
			}}},
			Devices: devices,
		},
	}
}
