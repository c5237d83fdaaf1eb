package deviceplugin

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestPublishLabels: the node gets the share sizes as labels (the smallest over its GPUs) and
// every GPU's in the annotation, by server-side apply; labels of others stay.
func TestPublishLabels(t *testing.T) {
	devs := testGPUs(2, 80*gib)
	devs[1].MemoryBytes = 40 * gib
	inv, err := NewInventory(devs, Sizing{SharesPerGPU: 2}, resource)
	if err != nil {
		t.Fatal(err)
	}
	labels, annotations, err := nodeMetadata(inv, resource)
	if err != nil {
		t.Fatal(err)
	}
	kube := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{"other": "x"}}})
	publishLabels(context.Background(), kube, "node-1", labels, annotations, logr.Discard())
	node, err := kube.CoreV1().Nodes().Get(context.Background(), "node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"vgpu.dra.dev/vgpu.shares-per-gpu": "2", "vgpu.dra.dev/vgpu.memory-mib": "20480", "vgpu.dra.dev/vgpu.cores": "100", "other": "x",
	} {
		if node.Labels[k] != v {
			t.Errorf("label %s=%q, want %q", k, node.Labels[k], v)
		}
	}
	var per []ShareSizes
	if err := json.Unmarshal([]byte(node.Annotations["vgpu.dra.dev/vgpu.shares"]), &per); err != nil || len(per) != 2 {
		t.Fatalf("annotation %q: %v", node.Annotations["vgpu.dra.dev/vgpu.shares"], err)
	}
	if per[0].MemoryBytes != 40*gib || per[1].MemoryBytes != 20*gib || per[1].Shares != 2 || per[0].UUID != devs[0].UUID {
		t.Errorf("annotation %+v", per)
	}
}
