//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	metaac "k8s.io/client-go/applyconfigurations/meta/v1"
	resourceac "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Helpers of dra_features_test.go: the simulated GPUs' control socket, the checks of who may
// write a claim's device status, and the cleanup (the examples: examples_test.go).

// controlSocket is the plugin's simulated-GPU control socket on the host (contract §11).
const controlSocket = "/var/lib/vgpu-dra/simulated-gpu.sock"

func controlClient() *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", controlSocket)
	}}}
}

// simulatedGPUs returns the UUIDs of the plugin's n simulated GPUs by index.
func simulatedGPUs(t *testing.T, n int) []string {
	t.Helper()
	var gpus []struct {
		Index int    `json:"index"`
		UUID  string `json:"uuid"`
	}
	eventually(t, defaultTimeout, "the simulated-GPU control socket", func() (bool, error) {
		resp, err := controlClient().Get("http://localhost/gpus")
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		return json.NewDecoder(resp.Body).Decode(&gpus) == nil && len(gpus) == n, fmt.Errorf("gpus %+v", gpus)
	})
	out := make([]string, len(gpus))
	for _, g := range gpus {
		out[g.Index] = g.UUID
	}
	return out
}

func controlPOST(t *testing.T, path string) {
	t.Helper()
	resp, err := controlClient().Post("http://localhost"+path, "text/plain", nil)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("POST %s: %s %s", path, resp.Status, body)
	}
}

// nodeName is the cluster's one node.
func nodeName(t *testing.T) string {
	t.Helper()
	nodes, err := kube.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 1 {
		t.Fatalf("nodes: %v %v", nodes, err)
	}
	return nodes.Items[0].Name
}

// pluginIdentity is a client that acts as the plugin's service account, with its token bound to
// node (the extra the API server and the chart's policy key on), as an impersonation.
func pluginIdentity(t *testing.T, node string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + pluginNS + ":" + release + "-kubelet-plugin",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + pluginNS, "system:authenticated"},
		Extra:    map[string][]string{"authentication.kubernetes.io/node-name": {node}},
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// applyStatusAs dry-runs the plugin's write of one status entry of the claim as the plugin of
// node would.
func applyStatusAs(t *testing.T, node string, claim *resourceapi.ResourceClaim, pool, device string, share *string) error {
	t.Helper()
	entry := resourceac.AllocatedDeviceStatus().WithDriver(driverName).WithPool(pool).WithDevice(device).
		WithConditions(metaac.Condition().WithType("Ready").WithStatus(metav1.ConditionTrue).WithReason("Prepared").
			WithMessage("e2e").WithLastTransitionTime(metav1.Now()))
	if share != nil {
		entry = entry.WithShareID(*share)
	}
	ac := resourceac.ResourceClaim(claim.Name, claim.Namespace).WithStatus(resourceac.ResourceClaimStatus().WithDevices(entry))
	_, err := pluginIdentity(t, node).ResourceV1().ResourceClaims(claim.Namespace).ApplyStatus(context.Background(), ac,
		metav1.ApplyOptions{FieldManager: "e2e-as-plugin", Force: true, DryRun: []string{metav1.DryRunAll}})
	return err
}

// checkStatusWriters: the plugin's identity may write the device status of a claim allocated on
// its node, for its own pool; bound to another node it may not (Kubernetes' associated-node
// check of rbac.yaml), and an entry of another pool is refused by the chart's policy even on a
// claim allocated on its node, as is the removal of another pool's entry.
func checkStatusWriters(t *testing.T, claim *resourceapi.ResourceClaim, node string) {
	ctx := context.Background()
	c, err := kube.ResourceV1().ResourceClaims(featNS).Get(ctx, claim.Name, metav1.GetOptions{})
	if err != nil || c.Status.Allocation == nil {
		t.Fatalf("claim %s: %v", claim.Name, err)
	}
	share := (*string)(c.Status.Allocation.Devices.Results[0].ShareID)
	if err := applyStatusAs(t, node, c, node, "gpu-0", share); err != nil {
		t.Fatalf("the plugin of the claim's own node may not write its status: %v", err)
	}
	const other = "vgpu-e2e-other-node"
	// The API server's per-driver check answers with a field error of type Forbidden.
	err = applyStatusAs(t, other, c, node, "gpu-0", share)
	if err == nil || !strings.Contains(err.Error(), `resource="resourceclaims/driver"`) {
		t.Errorf("the plugin of node %s wrote the status of a claim allocated on %s: %v, want the per-driver check's refusal", other, node, err)
	}
	t.Logf("as the plugin of another node: %v", err)

	// A claim allocated, on this node, a device of another pool (an administrator writes the
	// allocation): the API server's node check passes, the chart's policy refuses the entry.
	forged := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "forged-pool", Namespace: featNS}, Spec: claimFor("x", "1Gi", 1).Spec}
	forged = createFeatClaim(t, forged)
	forged.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
			{Request: "gpu", Driver: driverName, Pool: other, Device: "gpu-0"}}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}},
	}
	if _, err := kube.ResourceV1().ResourceClaims(featNS).UpdateStatus(ctx, forged, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("allocate the forged claim: %v", err)
	}
	err = applyStatusAs(t, node, forged, other, "gpu-0", nil)
	if err == nil || !strings.Contains(err.Error(), "may only write the device status of its own node's devices") {
		t.Errorf("an entry of pool %s written by the plugin of %s: %v, want the policy's refusal", other, node, err)
	}
	t.Logf("an entry of another pool: %v", err)

	// An entry of that other pool already on the claim (written here by the administrator, as
	// that pool's plugin would): the plugin of node may not remove it either. A merge patch, the
	// one write of the status its RBAC allows besides apply.
	if forged, err = kube.ResourceV1().ResourceClaims(featNS).Get(ctx, forged.Name, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	forged.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: driverName, Pool: other, Device: "gpu-0",
		Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Prepared", Message: "e2e", LastTransitionTime: metav1.Now()}}}}
	if _, err := kube.ResourceV1().ResourceClaims(featNS).UpdateStatus(ctx, forged, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("write pool %s's entry of the forged claim: %v", other, err)
	}
	_, err = pluginIdentity(t, node).ResourceV1().ResourceClaims(featNS).Patch(ctx, forged.Name, types.MergePatchType,
		[]byte(`{"status":{"devices":null}}`), metav1.PatchOptions{FieldManager: "e2e-as-plugin", DryRun: []string{metav1.DryRunAll}}, "status")
	if err == nil || !strings.Contains(err.Error(), "may not change or remove the device status that another node's plugin or another driver wrote") {
		t.Errorf("pool %s's entry removed by the plugin of %s: %v, want the policy's refusal", other, node, err)
	}
	t.Logf("another pool's entry removed: %v", err)
}

func mustUnmarshal(t *testing.T, b []byte, into any) {
	t.Helper()
	if err := json.Unmarshal(b, into); err != nil {
		t.Fatal(err)
	}
}

// cleanupFeatures deletes the pods and claims, waits until the kubelet has unprepared them all,
// and uninstalls the chart, leaving the cluster as TestVGPU expects it.
func cleanupFeatures(t *testing.T) {
	ctx := context.Background()
	pods := kube.CoreV1().Pods(featNS)
	zero := metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](0)}
	if err := pods.DeleteCollection(ctx, zero, metav1.ListOptions{}); err != nil {
		t.Errorf("delete pods: %v", err)
	}
	eventually(t, defaultTimeout, "the feature pods gone", func() (bool, error) {
		l, err := pods.List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0, err
	})
	claims := kube.ResourceV1().ResourceClaims(featNS)
	// The forged claim was allocated by hand: take its allocation back, and the device status
	// that must match it, so its finalizer can go.
	if c, err := claims.Get(ctx, "forged-pool", metav1.GetOptions{}); err == nil && c.Status.Allocation != nil {
		c.Status.Allocation, c.Status.Devices = nil, nil
		if _, err := claims.UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
			t.Errorf("deallocate the forged claim: %v", err)
		}
	}
	if err := claims.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Errorf("delete claims: %v", err)
	}
	eventually(t, defaultTimeout, "the feature claims gone", func() (bool, error) {
		l, err := claims.List(ctx, metav1.ListOptions{})
		if err == nil && len(l.Items) > 0 {
			return false, fmt.Errorf("claims left: %s (finalizers %v)", l.Items[0].Name, l.Items[0].Finalizers)
		}
		return err == nil, err
	})
	eventually(t, defaultTimeout, "every claim unprepared", func() (bool, error) {
		specs, _ := filepathGlob("/var/run/cdi/" + driverName + "-claim_*.json")
		dirs, _ := filepathGlob("/var/lib/vgpu-dra/claims/*")
		return len(specs) == 0 && len(dirs) == 0, fmt.Errorf("specs %v, claim dirs %v", specs, dirs)
	})
	if err := kube.CoreV1().Namespaces().Delete(ctx, featNS, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete namespace: %v", err)
	}
	mustRun(t, "helm", "uninstall", release, "--namespace", pluginNS, "--wait", "--timeout", "2m")
	eventually(t, defaultTimeout, "the plugin pod gone", func() (bool, error) {
		l, err := kube.CoreV1().Pods(pluginNS).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0, err
	})
}
