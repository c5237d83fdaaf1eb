package nri

import (
	"context"
	"fmt"
	"testing"

	"github.com/containerd/nri/pkg/api"
)

// BenchmarkCreateContainerHook is the hook alone, in process: validation, directories, cache;
// each container is removed (and its directory with it) before the next, as in a churn.
func BenchmarkCreateContainerHook(b *testing.B) {
	f := newFixture(b, testClaim(claimA, gpu0))
	c := f.claims.claims[claimA]
	ctx := context.Background()
	p := pod(podA)
	for i := 0; b.Loop(); i++ {
		ctr := vgpuContainer(fmt.Sprint(i), p, "app", c, true)
		if _, _, err := f.plugin.CreateContainer(ctx, p, ctr); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		_ = f.plugin.RemoveContainer(ctx, p, ctr)
		b.StartTimer()
	}
}

// BenchmarkCreateContainerNotVGPU is the fast path every other container of the node takes.
func BenchmarkCreateContainerNotVGPU(b *testing.B) {
	f := &Plugin{}
	ctr := &api.Container{Id: "x", Name: "app", Env: []string{"PATH=/bin", "HOME=/root", "HOSTNAME=x", "TERM=xterm"}}
	for b.Loop() {
		if adj, _, _ := f.CreateContainer(context.Background(), nil, ctr); adj != nil {
			b.Fatal(adj)
		}
	}
}
