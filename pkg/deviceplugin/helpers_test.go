package deviceplugin

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

const (
	gib      = 1 << 30
	resource = "vgpu.dra.dev/vgpu"
)

// testGPUs are n GPUs of memory bytes each, at NVML indices 0..n-1.
func testGPUs(n int, memory uint64) []gpu.Device {
	out := make([]gpu.Device, n)
	for i := range out {
		numa := i / 2
		out[i] = gpu.Device{Index: i, UUID: fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i), MemoryBytes: memory, NUMANode: &numa}
	}
	return out
}

func testInventory(t testing.TB, gpus, shares int) *Inventory {
	t.Helper()
	inv, err := NewInventory(testGPUs(gpus, 80*gib), Sizing{SharesPerGPU: shares}, resource)
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// id is the device ID of share n of GPU g in a testInventory.
func id(g, n int) string { return ShareID(fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", g), n) }

// ids lists the share IDs of the given (GPU, number) pairs.
func ids(pairs ...[2]int) []string {
	out := make([]string, len(pairs))
	for i, p := range pairs {
		out[i] = id(p[0], p[1])
	}
	return out
}

// fakeKubelet is the pod-resources API with the pods the test says.
type fakeKubelet struct {
	mu   sync.Mutex
	pods []*podresourcesapi.PodResources
	err  error
}

func (f *fakeKubelet) List(context.Context, *podresourcesapi.ListPodResourcesRequest, ...grpc.CallOption) (*podresourcesapi.ListPodResourcesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	return &podresourcesapi.ListPodResourcesResponse{PodResources: slices.Clone(f.pods)}, nil
}

// set replaces the pods: each holds, in its one container "app", the device IDs given.
func (f *fakeKubelet) set(pods ...fakePod) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pods = nil
	for _, p := range pods {
		f.pods = append(f.pods, &podresourcesapi.PodResources{Namespace: p.ns, Name: p.name, Containers: []*podresourcesapi.ContainerResources{{
			Name: "app", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: p.resource, DeviceIds: p.ids}},
		}}})
	}
}

type fakePod struct {
	ns, name, resource string
	ids                []string
}
