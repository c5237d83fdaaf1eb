package integration

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// waitDeviceStatus waits until the claim's status.devices holds an entry of this node for the
// device whose Ready condition (the first) has the wanted status, and returns it.
func (n *node) waitDeviceStatus(c *resourceapi.ResourceClaim, device string, ready metav1.ConditionStatus) resourceapi.AllocatedDeviceStatus {
	n.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := n.kube.ResourceV1().ResourceClaims(c.Namespace).Get(context.Background(), c.Name, metav1.GetOptions{})
		if err != nil {
			n.t.Fatal(err)
		}
		for _, d := range got.Status.Devices {
			if d.Driver == driverName && d.Pool == nodeName && d.Device == device && len(d.Conditions) > 0 &&
				d.Conditions[0].Type == contract.DeviceConditionReady && d.Conditions[0].Status == ready {
				return d
			}
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("claim %s: no %s status entry for %s with Ready=%s; status.devices %+v", c.Name, nodeName, device, ready, got.Status.Devices)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestClaimDeviceStatus: after Prepare the plugin writes, in the background, a Ready condition
// and the data a user reads (GPU, granted memory and cores, path) for each result; a failed
// Prepare writes Ready=False with the reason. The writes are server-side applies of this node's
// field manager, and other writers' entries stay.
func TestClaimDeviceStatus(t *testing.T) {
	n := newNode(t)
	n.start()
	k := n.register()
	whole := n.newClaim("whole", allocated{request: "gpu", device: "gpu-0", shareID: shareN1})
	share := n.newClaim("share", allocated{request: "gpu/small", device: "gpu-0", memory: "10Gi", cores: 20, shareID: shareN2})
	if r := k.prepare(t, whole)[string(whole.UID)]; r.Error != "" {
		t.Fatal(r.Error)
	}
	// The GPU is taken whole: the share is refused (the last line of defence).
	if r := k.prepare(t, share)[string(share.UID)]; r.Error == "" {
		t.Fatal("a share of a GPU taken whole was prepared")
	}

	ok := n.waitDeviceStatus(whole, "gpu-0", metav1.ConditionTrue)
	if ok.Conditions[0].Type != contract.DeviceConditionReady || ok.Conditions[0].Reason != contract.DeviceReasonPrepared || ok.ShareID == nil || *ok.ShareID != shareN1 {
		t.Errorf("status entry %+v", ok)
	}
	var data contract.DeviceStatusData
	if ok.Data == nil || json.Unmarshal(ok.Data.Raw, &data) != nil {
		t.Fatalf("status entry without data: %+v", ok)
	}
	gpus := n.gpuList(t)
	if data.GPUUUID != gpus[0] || data.Request != "gpu" || data.Cores != 100 || data.Memory == "" || data.Path != contract.PathNRI || data.ProductName == "" {
		t.Errorf("status data %+v, want GPU %s, the whole memory, 100 cores, path nri", data, gpus[0])
	}
	if data.Class != "" || data.CoresCeiling != 0 {
		t.Errorf("status data %+v: a whole GPU has no class or ceiling (nothing divides it)", data)
	}

	bad := n.waitDeviceStatus(share, "gpu-0", metav1.ConditionFalse)
	if bad.Conditions[0].Reason != "Overcommitted" || bad.Conditions[0].Message == "" {
		t.Errorf("failed Prepare's condition %+v, want reason Overcommitted with a message", bad.Conditions[0])
	}
}
