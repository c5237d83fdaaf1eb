package integration

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	drahealth "k8s.io/kubelet/pkg/apis/dra-health/v1"
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
