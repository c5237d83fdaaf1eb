package integration

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	drahealth "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// controlClient talks to the simulated GPUs' control socket as an operator's curl would.
func (n *node) controlClient() *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", n.cfg.SimulatedControlSocketPath())
	}}}
}

func (n *node) control(t *testing.T, path string) {
	t.Helper()
	resp, err := n.controlClient().Post("http://localhost"+path, "text/plain", nil)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("POST %s: %s", path, resp.Status)
	}
}

// TestHealthRecoversThroughRecoveryAction is the whole cycle through the plugin's control
// socket: an XID taints the device (writing the new slice failing three times first, which the
// helper retries) and the kubelet's health stream reports it Unhealthy; NVML's recovery action
// asks for a reset; when it is back to none, the taint goes and the stream reports Healthy.
func TestHealthRecoversThroughRecoveryAction(t *testing.T) {
	n := newNode(t)
	var failSlices atomic.Int32
	// A changed taint makes the helper replace the slice (delete, then create): fail the creates.
	n.kube.PrependReactor("create", "resourceslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failSlices.Add(-1) >= 0 {
			return true, nil, errors.New("the API server is restarting")
		}
		return false, nil, nil
	})
	n.start()
	k := n.register()
	gpu1 := n.gpuList(t)[1]
	n.waitSlice(func(resourceapi.ResourceSlice) bool { return true })
	stream, err := drahealth.NewDRAResourceHealthClient(k.conn).NodeWatchResources(t.Context(), &drahealth.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil { // the full first report
		t.Fatal(err)
	}

	failSlices.Store(3)
	n.control(t, "/gpus/"+gpu1+"/xid/79")
	n.waitSlice(func(s resourceapi.ResourceSlice) bool {
		return len(s.Spec.Devices[1].Taints) == 1 && s.Spec.Devices[1].Taints[0].Effect == resourceapi.DeviceTaintEffectNoExecute
	})
	if r, err := stream.Recv(); err != nil || len(r.Devices) != 1 || r.Devices[0].Health != drahealth.HealthStatus_UNHEALTHY {
		t.Fatalf("health report after the XID: %v %v, want gpu-1 unhealthy", r, err)
	}
	if failSlices.Load() >= 0 {
		t.Errorf("the slice updates were not failed as the test intended (%d left)", failSlices.Load())
	}

	n.control(t, "/gpus/"+gpu1+"/recovery-action/1") // GPU reset needed: no change, already fatal
	n.control(t, "/gpus/"+gpu1+"/recovery-action/0") // reset done
	n.waitSlice(func(s resourceapi.ResourceSlice) bool { return len(s.Spec.Devices[1].Taints) == 0 })
	r, err := stream.Recv()
	if err != nil || len(r.Devices) != 1 || r.Devices[0].Device.DeviceName != "gpu-1" || r.Devices[0].Health != drahealth.HealthStatus_HEALTHY {
		t.Fatalf("health report after the recovery: %v %v, want gpu-1 healthy", r, err)
	}
}

// waitHealthy waits until the claim's entry for the device has a Healthy condition with the
// wanted status and returns it.
func (n *node) waitHealthy(c *resourceapi.ResourceClaim, device string, want metav1.ConditionStatus) metav1.Condition {
	n.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := n.kube.ResourceV1().ResourceClaims(c.Namespace).Get(context.Background(), c.Name, metav1.GetOptions{})
		if err != nil {
			n.t.Fatal(err)
		}
		for _, d := range got.Status.Devices {
			if d.Driver != driverName || d.Pool != nodeName || d.Device != device {
				continue
			}
			for _, cond := range d.Conditions {
				if cond.Type == contract.DeviceConditionHealthy && cond.Status == want {
					return cond
				}
			}
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("claim %s: no Healthy=%s condition for %s; status.devices %+v", c.Name, want, device, got.Status.Devices)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitPodEvents waits until the pod has events of this reason and returns how many times they
// were raised (an event raised again is counted on the same object).
func (n *node) waitPodEvents(namespace, pod, reason string) (count int32, last corev1.Event) {
	n.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		list, err := n.kube.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			n.t.Fatal(err)
		}
		count = 0
		for _, e := range list.Items {
			if e.InvolvedObject.Kind == "Pod" && e.InvolvedObject.Name == pod && e.Reason == reason {
				count += max(e.Count, 1)
				last = e
			}
		}
		if count > 0 {
			return count, last
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("no %s event on pod %s/%s; %d events in the namespace", reason, namespace, pod, len(list.Items))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHealthReachesTheClaimAndItsPod: what a user of either request path sees of a simulated GPU
// that fails and recovers while a pod uses it: the claim's Healthy condition goes False with the
// fault and what to do, a Warning event on the pod says the same; after the recovery the
// condition is True again and a Normal event says so; each event is raised once.
func TestHealthReachesTheClaimAndItsPod(t *testing.T) {
	n := newNode(t)
	n.start()
	k := n.register()
	gpu1 := n.gpuList(t)[1]
	claim := n.newClaim("watched", allocated{request: "gpu", device: "gpu-1", memory: "4Gi", cores: 10, shareID: shareN1})
	pod := claim.Status.ReservedFor[0].Name
	if r := k.prepare(t, claim)[string(claim.UID)]; r.Error != "" {
		t.Fatal(r.Error)
	}
	if c := n.waitHealthy(claim, "gpu-1", metav1.ConditionTrue); c.Reason != contract.DeviceReasonGPUHealthy {
		t.Errorf("Healthy after Prepare: %+v", c)
	}

	n.control(t, "/gpus/"+gpu1+"/xid/92")
	c := n.waitHealthy(claim, "gpu-1", metav1.ConditionFalse)
	if c.Reason != contract.DeviceReasonGPUUnhealthy || !strings.Contains(c.Message, "XID 92") || !strings.Contains(c.Message, gpu1) {
		t.Errorf("Healthy after XID 92: %+v, want %s naming the GPU and the XID", c, contract.DeviceReasonGPUUnhealthy)
	}
	_, warning := n.waitPodEvents(claim.Namespace, pod, contract.EventReasonDeviceUnhealthy)
	if warning.Type != corev1.EventTypeWarning || !strings.Contains(warning.Message, gpu1) || !strings.Contains(warning.Message, "delete it") {
		t.Errorf("event on the pod: %s %q, want a Warning naming the GPU and what to do", warning.Type, warning.Message)
	}

	n.control(t, "/gpus/"+gpu1+"/recovery-action/1") // a reset is needed: still unhealthy, no new event
	n.control(t, "/gpus/"+gpu1+"/recovery-action/0") // and done
	if c := n.waitHealthy(claim, "gpu-1", metav1.ConditionTrue); c.Reason != contract.DeviceReasonGPUHealthy {
		t.Errorf("Healthy after the recovery: %+v", c)
	}
	_, normal := n.waitPodEvents(claim.Namespace, pod, contract.EventReasonDeviceRecovered)
	if normal.Type != corev1.EventTypeNormal || !strings.Contains(normal.Message, gpu1) {
		t.Errorf("recovery event on the pod: %s %q, want a Normal one naming the GPU", normal.Type, normal.Message)
	}
	for reason, want := range map[string]int32{contract.EventReasonDeviceUnhealthy: 1, contract.EventReasonDeviceRecovered: 1} {
		if got, _ := n.waitPodEvents(claim.Namespace, pod, reason); got != want {
			t.Errorf("%s raised %d times, want %d: once per transition", reason, got, want)
		}
	}
}
