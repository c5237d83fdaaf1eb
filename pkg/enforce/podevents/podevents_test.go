package podevents

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/vgpu-dra/vgpu-dra/pkg/enforce"
)

// TestWarn: a target with a pod gets a Warning event on that pod (by namespace, name and UID)
// from the enforcer's component on this node; a target without a pod gets none.
func TestWarn(t *testing.T) {
	kube := fake.NewClientset()
	r := New(kube, "node-1")
	defer r.Shutdown()
	r.Warn(enforce.Target{Namespace: "ns", Claim: "per-claim"}, "VGPUMemoryLimitExceeded", "no pod: no event")
	r.Warn(enforce.Target{Namespace: "ns", Pod: "a", PodUID: "0b5a1c2d-3e4f-4a5b-8c6d-7e8f9a0b1c2d"}, "VGPUMemoryLimitExceeded", "killed")
	deadline := time.Now().Add(10 * time.Second)
	for {
		list, err := kube.CoreV1().Events("ns").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) > 0 {
			if len(list.Items) != 1 {
				t.Fatalf("events %+v, want one", list.Items)
			}
			ev := list.Items[0]
			o := ev.InvolvedObject
			if o.Kind != "Pod" || o.Name != "a" || string(o.UID) != "0b5a1c2d-3e4f-4a5b-8c6d-7e8f9a0b1c2d" || ev.Type != "Warning" ||
				ev.Reason != "VGPUMemoryLimitExceeded" || ev.Message != "killed" || ev.Source.Component != Component || ev.Source.Host != "node-1" {
				t.Errorf("event %+v", ev)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no event within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
