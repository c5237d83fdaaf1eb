package integration

import (
	"sync"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/containerd/nri/pkg/api"
)

// TestStopAnswersCreateContainerInFlight: the plugin is stopped (SIGTERM) while a
// CreateContainer is in flight through containerd's NRI runtime side; the container still gets
// its whole adjustment instead of the "ttrpc: closed" that containerd's NRI 0.12.3 answers by
// creating the container without it.
func TestStopAnswersCreateContainerInFlight(t *testing.T) {
	n := newNode(t)
	n.start()
	k := n.register()
	a := n.newClaim("a", allocated{request: "gpu", device: "gpu-0", memory: "4Gi", cores: 30, shareID: shareN1})
	resp := k.prepare(t, a)[string(a.UID)]
	n.waitSession(1)

	// A second pod shares the claim: the hook reads the claim from a slow API server, well
	// within the runtime's request timeout.
	second := &api.PodSandbox{Id: "sandbox-second", Uid: "90d00000-0000-4000-8000-0000000000fe", Namespace: "default", Name: "second"}
	a.Status.ReservedFor = append(a.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: second.Name, UID: types.UID(second.Uid)})
	if _, err := n.kube.ResourceV1().ResourceClaims(a.Namespace).UpdateStatus(t.Context(), a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	n.onClaimGet(func() {
		once.Do(func() { close(entered) })
		<-release
	})
	ctx := t.Context()
	if err := n.nri.runPod(ctx, second); err != nil {
		t.Fatal(err)
	}
	type created struct {
		adj *api.ContainerAdjustment
		err error
	}
	done := make(chan created, 1)
	go func() {
		adj, err := n.nri.create(ctx, second.Id, n.vgpuContainer("in-flight", "app", resp, string(a.UID)))
		done <- created{adj, err}
	}()
	<-entered
	stopped := make(chan struct{})
	go func() { n.stop(); close(stopped) }()
	// Stop waits for the hook; let the API answer well inside the drain deadline.
	close(release)
	c := <-done
	if c.err != nil || len(c.adj.GetMounts()) != 3 {
		t.Errorf("CreateContainer in flight at Stop: %d mounts, %v; want its whole adjustment", len(c.adj.GetMounts()), c.err)
	}
	<-stopped
}
