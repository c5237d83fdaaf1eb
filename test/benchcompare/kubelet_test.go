//go:build benchcompare

package benchcompare

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

const (
	nodeName  = "bench-node"
	namespace = "bench"
)

// kubelet is the kubelet's side of one driver: the registration handshake, then DRA calls.
type kubelet struct {
	dra  drapb.DRAPluginClient
	conn *grpc.ClientConn
}

// register waits for the driver's registration socket, does what the kubelet's plugin watcher
// does (GetInfo, NotifyRegistrationStatus) and dials the DRA endpoint GetInfo names.
func register(b *testing.B, regSocket string, p *proc) *kubelet {
	b.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(regSocket); err == nil {
			break
		}
		if p.exited() || time.Now().After(deadline) {
			b.Fatalf("%s: no registration socket %s:\n%s", p.name, regSocket, p.tail())
		}
		time.Sleep(20 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg, err := grpc.NewClient("unix://"+regSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer reg.Close()
	rc := registerapi.NewRegistrationClient(reg)
	info, err := rc.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		b.Fatalf("%s: GetInfo: %v", p.name, err)
	}
	if _, err := rc.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		b.Fatalf("%s: NotifyRegistrationStatus: %v", p.name, err)
	}
	endpoint := info.Endpoint
	if !filepath.IsAbs(endpoint) {
		endpoint = filepath.Join(filepath.Dir(regSocket), endpoint)
	}
	conn, err := grpc.NewClient("unix://"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	return &kubelet{dra: drapb.NewDRAPluginClient(conn), conn: conn}
}

func refs(claims []*resourceapi.ResourceClaim) []*drapb.Claim {
	out := make([]*drapb.Claim, len(claims))
	for i, c := range claims {
		out[i] = &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
	}
	return out
}

// prepare calls NodePrepareResources for the claims in one call; a claim's error is an error.
func (k *kubelet) prepare(claims ...*resourceapi.ResourceClaim) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	resp, err := k.dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: refs(claims)})
	took := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("NodePrepareResources: %w", err)
	}
	for uid, r := range resp.Claims {
		if r.Error != "" {
			return 0, fmt.Errorf("prepare %s: %s", uid, r.Error)
		}
	}
	return took, nil
}

// unprepare calls NodeUnprepareResources for the claims in one call; a claim's error is an
// error.
func (k *kubelet) unprepare(claims ...*resourceapi.ResourceClaim) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	resp, err := k.dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: refs(claims)})
	took := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("NodeUnprepareResources: %w", err)
	}
	for uid, r := range resp.Claims {
		if r.Error != "" {
			return 0, fmt.Errorf("unprepare %s: %s", uid, r.Error)
		}
	}
	return took, nil
}

// mustOf returns a function that fails the benchmark on a call's error and returns its
// duration: ok(k.prepare(c)).
func mustOf(b *testing.B) func(time.Duration, error) time.Duration {
	return func(d time.Duration, err error) time.Duration {
		b.Helper()
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
}

// workers makes one call per claim from n workers and returns the wall time of all of them.
func workers(b *testing.B, n int, claims []*resourceapi.ResourceClaim, call func(...*resourceapi.ResourceClaim) (time.Duration, error)) time.Duration {
	b.Helper()
	next := make(chan *resourceapi.ResourceClaim, len(claims))
	for _, c := range claims {
		next <- c
	}
	close(next)
	errs := make(chan error, len(claims))
	start := time.Now()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for c := range next {
				if _, err := call(c); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return took
}

// driverClaims creates n claims of one driver, each allocated one device of it (round robin
// over devices) and reserved for a pod of its own, as the scheduler and the claim controller
// would leave them. shareable claims ask for a 256Mi, 1 % share (our GPUs); others for a
// whole device.
func driverClaims(b *testing.B, kube kubernetes.Interface, driver string, devices []string, shareable bool, n int) []*resourceapi.ResourceClaim {
	b.Helper()
	ctx := context.Background()
	out := make([]*resourceapi.ResourceClaim, 0, n)
	for i := range n {
		req := resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: driver}}
		res := resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: driver, Pool: nodeName, Device: devices[i%len(devices)]}
		if shareable {
			capacity := map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("256Mi"), "cores": resource.MustParse("1")}
			req.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: capacity}
			share := types.UID(fmt.Sprintf("5a4e%04x-0000-4000-8000-%012d", i%0xffff, i))
			res.ShareID, res.ConsumedCapacity = &share, capacity
		}
		c := &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: fmt.Sprintf("%s-%d", driver, i)},
			Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}},
		}
		created, err := kube.ResourceV1().ResourceClaims(namespace).Create(ctx, c, metav1.CreateOptions{})
		if err != nil {
			b.Fatalf("create claim: %v", err)
		}
		created.Status = resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{res}}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: created.Name,
				UID: types.UID(fmt.Sprintf("90d0%04x-0000-4000-8000-%012d", i%0xffff, i))}},
		}
		updated, err := kube.ResourceV1().ResourceClaims(namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
		if err != nil {
			b.Fatalf("allocate claim: %v", err)
		}
		out = append(out, updated)
	}
	return out
}

// setupCluster creates what both drivers need in the API server: the namespace and the node.
func setupCluster(b *testing.B, kube kubernetes.Interface) {
	b.Helper()
	ctx := context.Background()
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	if _, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
}
