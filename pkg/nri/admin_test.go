package nri

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// adminClaim is a claim of one admin-access result on GPU 0, reserved for podA and podB.
func adminClaim(uid string) Claim {
	c := testClaim(uid, gpu0)
	c.Results[0].AdminAccess = true
	// The driver records no limit for admin access; what NRI writes must not depend on it.
	c.Results[0].MemoryBytes, c.Results[0].Cores = 4<<30, 30
	c.ReservedFor = []string{podA, podB}
	return c
}

// TestAdminAccessContainer: a container of admin-access results only gets its read-only config
// directory with a vgpu.config that lists its GPU without limits ("0 0": pass-through), and no
// writable ledger directories.
func TestAdminAccessContainer(t *testing.T) {
	c := adminClaim(claimA)
	f := newFixture(t, c)
	adj, err := f.create(pod(podA), vgpuContainer("mon", pod(podA), "monitor", c, true))
	if err != nil || adj == nil {
		t.Fatalf("adjustment %v, err %v", adj, err)
	}
	var dests []string
	for _, m := range adj.Mounts {
		dests = append(dests, m.Destination)
	}
	if !slices.Equal(dests, []string{contract.ContainerConfigDir}) {
		t.Errorf("mounts %v, want the config directory only", dests)
	}
	config, err := os.ReadFile(filepath.Join(f.dirs(claimA, podA, "monitor").Config, contract.ContainerConfigName))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(config), "gpu 0 "+gpu0+" 0 0\n") {
		t.Errorf("vgpu.config:\n%s\nwant gpu 0 with no limits", config)
	}
	parsed, err := contract.ParseContainerConfig(config)
	if err != nil || len(parsed.GPUs) != 1 || parsed.GPUs[0].MemoryBytes != 0 || parsed.GPUs[0].Cores != 0 {
		t.Errorf("the library would read %+v (err %v); want one GPU without limits", parsed, err)
	}
	in, _ := f.plugin.Cache().Lookup(podA, "monitor")
	if len(in.Results) != 0 || !slices.Equal(in.AdminResults, []int{0}) {
		t.Errorf("cache instance results %v admin %v, want admin result 0 only", in.Results, in.AdminResults)
	}
}

// TestAdminAccessIsNotOneRunningContainer: any number of running containers, of any pod,
// may use one admin-access result; a limited result in the same claim keeps the rule.
func TestAdminAccessIsNotOneRunningContainer(t *testing.T) {
	c := adminClaim(claimA)
	f := newFixture(t, c)
	for _, x := range []struct{ id, pod, name string }{{"a1", podA, "monitor"}, {"a2", podA, "exporter"}, {"b1", podB, "monitor"}} {
		if _, err := f.create(pod(x.pod), vgpuContainer(x.id, pod(x.pod), x.name, c, true)); err != nil {
			t.Fatalf("%s of pod %s on the admin-access result: %v", x.name, x.pod, err)
		}
	}

	mixed := testClaim(claimB, gpu0, gpu1)
	mixed.Results[1].AdminAccess = true
	mixed.ReservedFor = []string{podA, podB}
	f = newFixture(t, mixed)
	if _, err := f.create(pod(podA), vgpuContainer("a", pod(podA), "app", mixed, true)); err != nil {
		t.Fatal(err)
	}
	_, err := f.create(pod(podB), vgpuContainer("b", pod(podB), "app", mixed, true))
	if err == nil || !strings.Contains(err.Error(), `request "r0"`) {
		t.Fatalf("a second pod on the limited result: %v, want the rule to name request r0", err)
	}
}
