package nri

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/containerd/nri/pkg/api"
	kmetrics "k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

const (
	claimA = "0c1a1100-0000-4000-8000-00000000000a"
	claimB = "0c1a1100-0000-4000-8000-00000000000b"
	podA   = "90d00000-0000-4000-8000-00000000000a"
	podB   = "90d00000-0000-4000-8000-00000000000b"
	gpu0   = "GPU-00000000-0000-4000-8000-000000000000"
	gpu1   = "GPU-11111111-0000-4000-8000-000000000000"
)

// fakeClaims is an in-memory Claims; refresh answers ReservedFor.
type fakeClaims struct {
	mu      sync.Mutex
	claims  map[string]Claim
	refresh func(ctx context.Context, uid string) ([]string, error)
	reads   int
}

func (f *fakeClaims) Prepared(uid string) (Claim, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.claims[uid]
	return c, ok
}

func (f *fakeClaims) List() []Claim {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Claim
	for _, c := range f.claims {
		out = append(out, c)
	}
	return out
}

func (f *fakeClaims) ReservedFor(ctx context.Context, uid string) ([]string, error) {
	f.mu.Lock()
	f.reads++
	f.mu.Unlock()
	if f.refresh == nil {
		return nil, errors.New("no API server")
	}
	return f.refresh(ctx, uid)
}

// testClaim is a claim prepared on the NRI path for podA, with results on GPU 0 (and 1).
func testClaim(uid string, gpus ...string) Claim {
	c := Claim{
		UID: uid, Namespace: "default", Name: "claim-" + uid[len(uid)-1:], Path: contract.PathNRI, Completed: true,
		ReservedFor: []string{podA}, CommonCDIDevice: "vgpu.dra.dev/claim=" + uid + "-common",
	}
	for i, g := range gpus {
		dev := fmt.Sprintf("gpu-%d", i)
		c.Results = append(c.Results, Result{
			Request: fmt.Sprintf("r%d", i), Device: dev, GPUUUID: g, Index: i,
			CDIDevice: fmt.Sprintf("vgpu.dra.dev/claim=%s-r%d-%s", uid, i, dev),
		})
	}
	return c
}

type fixture struct {
	t       testing.TB
	layout  claimdir.Layout
	claims  *fakeClaims
	reg     kmetrics.KubeRegistry
	plugin  *Plugin
	proc    string
	metrics *metrics.NRIMetrics
}

func newFixture(t testing.TB, claims ...Claim) *fixture {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "vgn-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &fixture{t: t, layout: claimdir.Layout{StateDir: filepath.Join(dir, "state")}, claims: &fakeClaims{claims: map[string]Claim{}},
		reg: kmetrics.NewKubeRegistry(), proc: filepath.Join(dir, "proc")}
	for _, c := range claims {
		f.claims.claims[c.UID] = c
		if err := f.layout.EnsureClaimDir(c.UID); err != nil { // as Prepare does
			t.Fatal(err)
		}
	}
	f.metrics = metrics.NewNRIMetrics(f.reg)
	f.plugin = NewPlugin(Config{Layout: f.layout, ProcRoot: f.proc}, f.claims, f.metrics, klog.Background())
	return f
}

// fakePID gives a fake /proc/<pid>/cgroup.
func (f *fixture) fakePID(pid int, content string) {
	f.t.Helper()
	dir := filepath.Join(f.proc, fmt.Sprint(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(content), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func pod(uid string) *api.PodSandbox {
	return &api.PodSandbox{Id: "sb-" + uid[len(uid)-4:], Uid: uid, Namespace: "default", Name: "pod-" + uid[len(uid)-1:]}
}

// vgpuContainer has the env CDI leaves for a claim prepared on the NRI path, with the
// claim's results on the given GPUs, and (when withCDI) the CDI devices containerd ≥ 2.3 reports.
func vgpuContainer(id string, p *api.PodSandbox, name string, c Claim, withCDI bool) *api.Container {
	ctr := &api.Container{Id: id, PodSandboxId: p.Id, Name: name, Env: []string{
		"PATH=/usr/bin", contract.EnvClaimUID + "=" + c.UID, contract.EnvRegisterUUID + "=",
	}}
	for _, r := range c.Results {
		ctr.Env = append(ctr.Env, fmt.Sprintf("%s%d=%s", contract.EnvVisibleDevicePfx, r.Index, r.GPUUUID), fmt.Sprintf("%s%d=4096m", contract.EnvMemLimitPfx, r.Index))
		if withCDI {
			ctr.CDIDevices = append(ctr.CDIDevices, &api.CDIDevice{Name: r.CDIDevice}, &api.CDIDevice{Name: c.CommonCDIDevice})
		}
	}
	return ctr
}

func (f *fixture) counter(name, label, value string) float64 {
	f.t.Helper()
	families, err := f.reg.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, fam := range families {
		if fam.GetName() != name {
			continue
		}
		for _, m := range fam.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				match = match || (l.GetName() == label && l.GetValue() == value)
			}
			if match {
				if m.GetCounter() != nil {
					return m.GetCounter().GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

func (f *fixture) create(p *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, error) {
	adj, upd, err := f.plugin.CreateContainer(context.Background(), p, ctr)
	if len(upd) != 0 {
		f.t.Errorf("CreateContainer returned updates: %v", upd)
	}
	return adj, err
}

func (f *fixture) dirs(claim, podUID, name string) claimdir.Dirs {
	d, err := f.layout.ContainerDirs(claim, podUID, name)
	if err != nil {
		f.t.Fatal(err)
	}
	return d
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// anyContainerDirs reports whether any prepared claim has a container directory.
func (f *fixture) anyContainerDirs() bool {
	f.t.Helper()
	for uid := range f.claims.claims {
		refs, err := f.layout.ListContainerDirs(uid)
		if err != nil {
			f.t.Fatal(err)
		}
		if len(refs) > 0 {
			return true
		}
	}
	return false
}
