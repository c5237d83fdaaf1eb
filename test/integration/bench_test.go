package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

// noopPlugin prepares nothing: the baseline is the helper's own cost (claim GET from the API,
// gRPC over the unix socket) that every DRA driver pays.
type noopPlugin struct{}

func (noopPlugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		out[c.UID] = kubeletplugin.PrepareResult{}
	}
	return out, nil
}

func (noopPlugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = nil
	}
	return out, nil
}

func (noopPlugin) HandleError(context.Context, error, string) {}

func (noopPlugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// startNoop serves noopPlugin through the same helper, on the claims of kube.
func startNoop(b *testing.B, kube *fake.Clientset) drapb.DRAPluginClient {
	dir, err := os.MkdirTemp("/tmp", "vgb-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	for _, sub := range []string{"reg", "data"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o750); err != nil {
			b.Fatal(err)
		}
	}
	h, err := kubeletplugin.Start(context.Background(), noopPlugin{},
		kubeletplugin.DriverName("noop.example.com"), kubeletplugin.NodeName(nodeName), kubeletplugin.KubeClient(kube),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(dir, "reg")), kubeletplugin.PluginDataDirectoryPath(filepath.Join(dir, "data")),
		kubeletplugin.Serialize(false), kubeletplugin.HealthService(false))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(h.Stop)
	conn := dial(b, filepath.Join(dir, "data", "dra.sock"))
	b.Cleanup(func() { conn.Close() })
	return drapb.NewDRAPluginClient(conn)
}

func cycle(b *testing.B, c drapb.DRAPluginClient, claims []*drapb.Claim) (prep, unprep time.Duration) {
	ctx := context.Background()
	start := time.Now()
	resp, err := c.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: claims})
	if err != nil {
		b.Fatal(err)
	}
	for uid, r := range resp.Claims {
		if r.Error != "" {
			b.Fatalf("prepare %s: %s", uid, r.Error)
		}
	}
	mid := time.Now()
	if _, err := c.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: claims}); err != nil {
		b.Fatal(err)
	}
	return mid.Sub(start), time.Since(mid)
}

// BenchmarkPrepareUnprepare measures NodePrepareResources and NodeUnprepareResources through
// the kubelet's gRPC path for 1 claim and a burst of 100 claims in one call, and the same
// calls against a no-op driver in the same run (x-noop = our time / baseline time).
func BenchmarkPrepareUnprepare(b *testing.B) {
	for _, burst := range []int{1, 100} {
		b.Run(fmt.Sprintf("claims=%d", burst), func(b *testing.B) {
			n := newNode(b)
			n.start()
			k := n.register()
			var rcs []*resourceapi.ResourceClaim
			for i := range burst {
				rcs = append(rcs, n.newClaim(fmt.Sprintf("bench-%d", i), allocated{request: "gpu", device: fmt.Sprintf("gpu-%d", i%2),
					memory: "256Mi", cores: 1, shareID: fmt.Sprintf("5a4e%04d-0000-4000-8000-000000000000", i)}))
			}
			claims := draClaims(rcs)
			noop := startNoop(b, n.kube)
			const baseRounds = 20
			var baseP, baseU time.Duration
			for range baseRounds {
				p, u := cycle(b, noop, claims)
				baseP, baseU = baseP+p, baseU+u
			}
			b.ReportAllocs()
			b.ResetTimer()
			var ourP, ourU time.Duration
			for range b.N {
				p, u := cycle(b, k.dra, claims)
				ourP, ourU = ourP+p, ourU+u
			}
			b.StopTimer()
			perClaim := func(d time.Duration, rounds int) float64 {
				return float64(d.Nanoseconds()) / float64(rounds*burst)
			}
			b.ReportMetric(perClaim(ourP, b.N), "prepare-ns/claim")
			b.ReportMetric(perClaim(ourU, b.N), "unprepare-ns/claim")
			b.ReportMetric(perClaim(baseP, baseRounds), "noop-prepare-ns/claim")
			b.ReportMetric(perClaim(ourP, b.N)/perClaim(baseP, baseRounds), "prepare-x-noop")
			b.ReportMetric(perClaim(ourU, b.N)/perClaim(baseU, baseRounds), "unprepare-x-noop")
		})
	}
}
