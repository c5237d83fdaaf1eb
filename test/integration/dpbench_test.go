package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/vgpu-dra/vgpu-dra/pkg/deviceplugin"
)

// noopDevicePlugin answers Allocate and GetPreferredAllocation with nothing to do: the baseline
// is the kubelet's gRPC round trip over a unix socket, which every device plugin pays.
type noopDevicePlugin struct {
	pluginapi.UnimplementedDevicePluginServer
}

func (noopDevicePlugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	out := &pluginapi.AllocateResponse{}
	for range req.ContainerRequests {
		out.ContainerResponses = append(out.ContainerResponses, &pluginapi.ContainerAllocateResponse{})
	}
	return out, nil
}

func (noopDevicePlugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	out := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.ContainerRequests {
		out.ContainerResponses = append(out.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: cr.MustIncludeDeviceIDs})
	}
	return out, nil
}

// startNoopDevicePlugin serves noopDevicePlugin on a socket of its own and dials it.
func startNoopDevicePlugin(b *testing.B) pluginapi.DevicePluginClient {
	dir, err := os.MkdirTemp("/tmp", "vgn-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	lis, err := net.Listen("unix", filepath.Join(dir, "noop.sock"))
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, noopDevicePlugin{})
	go func() { _ = srv.Serve(lis) }()
	b.Cleanup(srv.Stop)
	conn := dial(b, filepath.Join(dir, "noop.sock"))
	b.Cleanup(func() { _ = conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

// interleaved times n calls of ours and of base, one after the other, after a few unmeasured
// calls of each: drift on a shared machine (other builds, the CPU's clock) hits both alike.
// Both lists come back sorted.
func interleaved(b *testing.B, n int, ours, base func() error) (o, ba []time.Duration) {
	for range 20 {
		if err := ours(); err != nil {
			b.Fatal(err)
		}
		if err := base(); err != nil {
			b.Fatal(err)
		}
	}
	o, ba = make([]time.Duration, n), make([]time.Duration, n)
	b.ResetTimer()
	for i := range n {
		start := time.Now()
		if err := ours(); err != nil {
			b.Fatal(err)
		}
		o[i] = time.Since(start)
		b.StopTimer()
		start = time.Now()
		if err := base(); err != nil {
			b.Fatal(err)
		}
		ba[i] = time.Since(start)
		b.StartTimer()
	}
	b.StopTimer()
	slices.Sort(o)
	slices.Sort(ba)
	return o, ba
}

func quantile(d []time.Duration, q float64) float64 {
	return float64(d[min(len(d)-1, int(q*float64(len(d))))].Nanoseconds())
}

func mean(d []time.Duration) float64 {
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return float64(sum.Nanoseconds()) / float64(len(d))
}

// reportAgainst reports our latencies (mean, p50, p99) next to the baseline's median, measured in
// the same run, and the ratio of the medians.
func reportAgainst(b *testing.B, ours, base []time.Duration) {
	b.ReportMetric(mean(ours), "ns/call")
	b.ReportMetric(quantile(ours, 0.5), "p50-ns")
	b.ReportMetric(quantile(ours, 0.99), "p99-ns")
	b.ReportMetric(quantile(base, 0.5), "noop-p50-ns")
	b.ReportMetric(quantile(ours, 0.5)/quantile(base, 0.5), "p50-x-noop")
}

// BenchmarkDevicePluginAllocate measures Allocate through the kubelet's gRPC connection, for a
// container of one share and of two shares of one GPU (merged): validation, a fresh tmpfs for
// the lead's directory set (the old one detached), vgpu.config, env. The baseline is a no-op
// plugin's Allocate over the same kind of socket, called in turn with ours (p50-x-noop = our
// median / its median).
func BenchmarkDevicePluginAllocate(b *testing.B) {
	for _, shares := range []int{1, 2} {
		b.Run(fmt.Sprintf("shares=%d", shares), func(b *testing.B) {
			n := newDPNode(b)
			n.startKubelet()
			n.start()
			n.waitAllocatable(2 * dpShares)
			var ids []string
			for i := range shares {
				ids = append(ids, deviceplugin.ShareID(n.gpuUUID(0), i))
			}
			req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}}
			ctx := context.Background()
			noop := startNoopDevicePlugin(b)
			ours := n.kubelet.plugin()
			b.ReportAllocs()
			got, base := interleaved(b, b.N,
				func() error { _, err := ours.Allocate(ctx, req); return err },
				func() error { _, err := noop.Allocate(ctx, req); return err })
			reportAgainst(b, got, base)
		})
	}
}

// BenchmarkDevicePluginPreferredAllocation measures GetPreferredAllocation through the
// kubelet's gRPC connection on 8 GPUs of 10 shares (80 devices, every other one available),
// asking for 1 and for 4 shares with one must-include, by each policy. The baseline is a no-op
// plugin that answers the must-include IDs over the same kind of socket, called in turn.
func BenchmarkDevicePluginPreferredAllocation(b *testing.B) {
	for _, policy := range []deviceplugin.Policy{deviceplugin.PolicyBinpack, deviceplugin.PolicySpread} {
		for _, size := range []int32{1, 4} {
			b.Run(fmt.Sprintf("policy=%s/size=%d", policy, size), func(b *testing.B) {
				n := newDPNodeGPUs(b, 8, func(c *deviceplugin.Config) { c.Sizing.SharesPerGPU = 10; c.Policy = policy })
				n.startKubelet()
				n.start()
				n.waitAllocatable(80)
				var available []string
				for g := range 8 {
					for s := 0; s < 10; s += 2 {
						available = append(available, deviceplugin.ShareID(n.gpuUUID(g), s))
					}
				}
				req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
					AvailableDeviceIDs: available, MustIncludeDeviceIDs: available[7:8], AllocationSize: size,
				}}}
				ctx := context.Background()
				noop := startNoopDevicePlugin(b)
				ours := n.kubelet.plugin()
				b.ReportAllocs()
				got, base := interleaved(b, b.N,
					func() error { _, err := ours.GetPreferredAllocation(ctx, req); return err },
					func() error { _, err := noop.GetPreferredAllocation(ctx, req); return err })
				reportAgainst(b, got, base)
			})
		}
	}
}
