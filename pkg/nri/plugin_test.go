package nri

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

func TestCreateContainerWithoutClaimIsUntouched(t *testing.T) {
	f := newFixture(t, testClaim(claimA, gpu0))
	for _, env := range [][]string{nil, {"PATH=/bin"}, {contract.EnvClaimUID + "="}} {
		adj, err := f.create(pod(podA), &api.Container{Id: "c1", Name: "app", Env: env})
		if adj != nil || err != nil {
			t.Errorf("env %v: adjustment %v, err %v; want neither", env, adj, err)
		}
	}
	if f.plugin.Cache().Len() != 0 || f.anyContainerDirs() || f.claims.reads != 0 {
		t.Error("a container without a claim UID left state behind or read the API")
	}
}

func TestCreateContainerInjects(t *testing.T) {
	for _, withCDI := range []bool{false, true} {
		f := newFixture(t, testClaim(claimA, gpu0, gpu1))
		c := f.claims.claims[claimA]
		adj, err := f.create(pod(podA), vgpuContainer("c1", pod(podA), "app", c, withCDI))
		if err != nil || adj == nil {
			t.Fatalf("CDI devices %v: adjustment %v, err %v", withCDI, adj, err)
		}
		d := f.dirs(claimA, podA, "app")
		want := map[string]struct {
			src string
			ro  bool
		}{
			contract.ContainerConfigDir:   {d.Config, true},
			contract.ContainerVGPULockDir: {d.VGPULock, false},
			contract.ContainerVMemNodeDir: {d.VMemNode, false},
		}
		if len(adj.Mounts) != 3 {
			t.Fatalf("mounts %v, want 3", adj.Mounts)
		}
		for _, m := range adj.Mounts {
			w, ok := want[m.Destination]
			if !ok || m.Source != w.src || m.Type != "bind" || slices.Contains(m.Options, "ro") != w.ro || !slices.Contains(m.Options, "nosuid") {
				t.Errorf("mount %v unexpected", m)
			}
		}
		env := map[string]string{}
		for _, e := range adj.Env {
			env[e.Key] = e.Value
		}
		if len(env) != 2 || env[contract.EnvPodUID] != podA || env[contract.EnvContainerName] != "app" {
			t.Errorf("env %v", env)
		}
		for dir, mode := range map[string]os.FileMode{d.Config: 0o755, d.VGPULock: 0o777 | os.ModeSticky, d.VMemNode: 0o777 | os.ModeSticky, d.Root: 0o700} {
			fi, err := os.Lstat(dir)
			if err != nil || fi.Mode()&(os.ModePerm|os.ModeSticky) != mode || !fi.IsDir() {
				t.Errorf("%s: %v %v, want dir %v", dir, fi, err, mode)
			}
		}
		in, ok := f.plugin.Cache().Lookup(podA, "app")
		if !ok || in.ContainerID != "c1" || in.ClaimUID != claimA || in.ConfigDir != d.Config || in.State != StateCreated || !slices.Equal(in.Results, []int{0, 1}) {
			t.Errorf("cache instance %+v", in)
		}
		if got := f.counter("vgpu_dra_nri_injections_total", "", ""); got != 1 {
			t.Errorf("injections %v", got)
		}
	}
}

func TestCreateContainerRejections(t *testing.T) {
	notDone := testClaim(claimB, gpu0)
	notDone.Completed = false
	perClaim := testClaim(claimB, gpu0)
	perClaim.Path = contract.PathPerClaim
	good := testClaim(claimA, gpu0)
	for _, tc := range []struct {
		name   string
		claims []Claim
		pod    string
		ctr    func(*api.Container)
		reason string
	}{
		{"malformed claim UID", []Claim{good}, podA, func(c *api.Container) { c.Env[1] = contract.EnvClaimUID + "=../../etc" }, contract.RejectInvalidValue},
		{"upper-case claim UID", []Claim{good}, podA, func(c *api.Container) { c.Env[1] = contract.EnvClaimUID + "=" + strings.ToUpper(claimA) }, contract.RejectInvalidValue},
		{"container name not a DNS label", []Claim{good}, podA, func(c *api.Container) { c.Name = "App_1" }, contract.RejectInvalidValue},
		{"two claim UIDs in env", []Claim{good}, podA, func(c *api.Container) { c.Env = append(c.Env, contract.EnvClaimUID+"="+claimB) }, contract.RejectInvalidValue},
		{"CDI devices without the claim's", []Claim{good}, podA, func(c *api.Container) { c.CDIDevices = []*api.CDIDevice{{Name: "nvidia.com/gpu=" + gpu0}} }, contract.RejectInvalidValue},
		{"claim unknown (forged)", []Claim{good}, podA, func(c *api.Container) { c.Env[1] = contract.EnvClaimUID + "=" + claimB }, contract.RejectClaimNotPrepared},
		{"claim not completed", []Claim{good, notDone}, podA, func(c *api.Container) { c.Env[1] = contract.EnvClaimUID + "=" + claimB }, contract.RejectClaimNotPrepared},
		{"per-claim path", []Claim{good, perClaim}, podA, func(c *api.Container) { c.Env[1] = contract.EnvClaimUID + "=" + claimB }, contract.RejectWrongPath},
		{"pod not reserved", []Claim{good}, podB, func(*api.Container) {}, contract.RejectPodNotReserved},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.claims...)
			f.claims.refresh = func(context.Context, string) ([]string, error) { return []string{podA}, nil }
			p := pod(tc.pod)
			ctr := vgpuContainer("c1", p, "app", good, false)
			tc.ctr(ctr)
			adj, err := f.create(p, ctr)
			if adj != nil || err != nil {
				t.Fatalf("adjustment %v, err %v; want a rejection without either", adj, err)
			}
			if got := f.counter("vgpu_dra_nri_rejections_total", "reason", tc.reason); got != 1 {
				t.Errorf("rejections{reason=%s} = %v, want 1", tc.reason, got)
			}
			if f.plugin.Cache().Len() != 0 || f.anyContainerDirs() {
				t.Error("a rejected container left a cache entry or a directory")
			}
		})
	}
}

func TestReservedForIsReadOnceOnAMiss(t *testing.T) {
	f := newFixture(t, testClaim(claimA, gpu0))
	var deadline time.Duration
	f.claims.refresh = func(ctx context.Context, uid string) ([]string, error) {
		d, _ := ctx.Deadline()
		deadline = time.Until(d)
		return []string{podA, podB}, nil
	}
	c := f.claims.claims[claimA]
	if _, err := f.create(pod(podA), vgpuContainer("c1", pod(podA), "app", c, true)); err != nil || f.claims.reads != 0 {
		t.Fatalf("recorded pod: err %v, API reads %d; want none", err, f.claims.reads)
	}
	// A second pod sharing the claim: one read, bounded by 500 ms.
	f.plugin.StopContainer(context.Background(), pod(podA), &api.Container{Id: "c1"})
	adj, err := f.create(pod(podB), vgpuContainer("c2", pod(podB), "app", c, true))
	if err != nil || adj == nil || f.claims.reads != 1 || deadline <= 0 || deadline > DefaultRefreshTimeout {
		t.Fatalf("second pod: adjustment %v err %v reads %d deadline %v", adj, err, f.claims.reads, deadline)
	}
	// An API failure fails the container (the kubelet retries); it is not a silent rejection.
	f.claims.refresh = func(context.Context, string) ([]string, error) { return nil, errors.New("connection refused") }
	p3 := pod("90d00000-0000-4000-8000-00000000000c")
	if _, err := f.create(p3, vgpuContainer("c3", p3, "app", c, true)); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("API error: err %v, want it to fail the container", err)
	}
}

func TestCreateContainerCollisions(t *testing.T) {
	a, b := testClaim(claimA, gpu0), testClaim(claimB, gpu1)
	b.Namespace, b.Name = "default", "other"
	twoOnOne := testClaim(claimB, gpu0, gpu0)
	t.Run("two claims", func(t *testing.T) {
		f := newFixture(t, a, b)
		ctr := vgpuContainer("c1", pod(podA), "app", a, true)
		ctr.CDIDevices = append(ctr.CDIDevices, &api.CDIDevice{Name: b.Results[0].CDIDevice}, &api.CDIDevice{Name: b.CommonCDIDevice})
		_, err := f.create(pod(podA), ctr)
		var ce *CollisionError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "default/claim-a") || !strings.Contains(err.Error(), "default/other") {
			t.Fatalf("err %v, want a collision naming both claims", err)
		}
		if f.plugin.Cache().Len() != 0 || f.anyContainerDirs() {
			t.Error("a failed container left state")
		}
	})
	t.Run("two results on one GPU", func(t *testing.T) {
		f := newFixture(t, twoOnOne)
		_, err := f.create(pod(podA), vgpuContainer("c1", pod(podA), "app", twoOnOne, true))
		if err == nil || !strings.Contains(err.Error(), `"r0"`) || !strings.Contains(err.Error(), `"r1"`) || !strings.Contains(err.Error(), gpu0) {
			t.Fatalf("err %v, want a collision naming both requests and the GPU", err)
		}
	})
}

func TestOneResultOneRunningContainer(t *testing.T) {
	c := testClaim(claimA, gpu0)
	c.ReservedFor = []string{podA, podB}
	f := newFixture(t, c)
	ctx := context.Background()
	if _, err := f.create(pod(podA), vgpuContainer("init", pod(podA), "init", c, true)); err != nil {
		t.Fatal(err)
	}
	// Another name in the same pod while the first has not stopped.
	_, err := f.create(pod(podA), vgpuContainer("app", pod(podA), "app", c, true))
	if err == nil || !strings.Contains(err.Error(), `request "r0" of claim default/claim-a`) || !strings.Contains(err.Error(), `"init"`) {
		t.Fatalf("second name on a result in use: %v", err)
	}
	// The init container exits: the app container after it is fine.
	f.plugin.StopContainer(ctx, pod(podA), &api.Container{Id: "init"})
	if _, err := f.create(pod(podA), vgpuContainer("app", pod(podA), "app", c, true)); err != nil {
		t.Fatalf("after the init container stopped: %v", err)
	}
	// Another pod on the same result while app runs.
	if _, err := f.create(pod(podB), vgpuContainer("b", pod(podB), "app", c, false)); err == nil {
		t.Fatal("a second pod got a result in use")
	}
	// A new instance of the same name (restart) is fine.
	if _, err := f.create(pod(podA), vgpuContainer("app-2", pod(podA), "app", c, true)); err != nil {
		t.Fatalf("restarted instance: %v", err)
	}
	if got := f.counter("vgpu_dra_nri_errors_total", "hook", "create_container"); got != 2 {
		t.Errorf("errors{create_container} = %v, want 2", got)
	}
}

func TestStartContainerRecordsPIDAndCgroup(t *testing.T) {
	c := testClaim(claimA, gpu0)
	f := newFixture(t, c)
	f.fakePID(4242, "12:pids:/kubepods/pod"+podA+"/c1\n5:cpu,cpuacct:/kubepods/x\n0::/kubepods.slice/c1.scope\n")
	if _, err := f.create(pod(podA), vgpuContainer("c1", pod(podA), "app", c, true)); err != nil {
		t.Fatal(err)
	}
	if err := f.plugin.StartContainer(context.Background(), pod(podA), &api.Container{Id: "c1", Name: "app", Pid: 4242}); err != nil {
		t.Fatal(err)
	}
	in, _ := f.plugin.Cache().Lookup(podA, "app")
	want := Cgroup{PIDsV1: "/kubepods/pod" + podA + "/c1", Unified: "/kubepods.slice/c1.scope"}
	if in.PID != 4242 || in.Cgroup != want || in.State != StateRunning {
		t.Errorf("instance %+v, want PID 4242, cgroup %+v, running", in, want)
	}
	// Not ours: nothing recorded, no error.
	if err := f.plugin.StartContainer(context.Background(), pod(podA), &api.Container{Id: "other", Pid: 1}); err != nil || f.plugin.Cache().Len() != 1 {
		t.Error("StartContainer of a foreign container changed the cache")
	}
}

func TestRemoveIsKeyedByContainerID(t *testing.T) {
	c := testClaim(claimA, gpu0)
	f := newFixture(t, c)
	ctx := context.Background()
	d := f.dirs(claimA, podA, "app")
	if _, err := f.create(pod(podA), vgpuContainer("old", pod(podA), "app", c, true)); err != nil {
		t.Fatal(err)
	}
	f.plugin.StopContainer(ctx, pod(podA), &api.Container{Id: "old"})
	if _, err := f.create(pod(podA), vgpuContainer("new", pod(podA), "app", c, true)); err != nil {
		t.Fatal(err)
	}
	// Garbage collection of the dead instance must not touch the running one.
	if err := f.plugin.RemoveContainer(ctx, pod(podA), &api.Container{Id: "old", Name: "app"}); err != nil {
		t.Fatal(err)
	}
	if in, ok := f.plugin.Cache().Lookup(podA, "app"); !ok || in.ContainerID != "new" || !exists(d.Config) {
		t.Fatalf("after removing the old instance: %+v %v, dir exists %v", in, ok, exists(d.Config))
	}
	if err := f.plugin.RemoveContainer(ctx, pod(podA), &api.Container{Id: "unknown"}); err != nil || f.plugin.Cache().Len() != 1 {
		t.Error("removing an unknown container changed something")
	}
	if err := f.plugin.RemoveContainer(ctx, pod(podA), &api.Container{Id: "new", Name: "app"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.plugin.Cache().Lookup(podA, "app"); ok || exists(d.Root) {
		t.Error("the last instance's removal left its entry or directory")
	}
	if !exists(f.layout.ClaimsRoot() + "/" + claimA) {
		t.Error("the claim directory went with a container's")
	}
}

func TestStopPodSandboxRemovesThePodsDirectories(t *testing.T) {
	c := testClaim(claimA, gpu0, gpu1)
	f := newFixture(t, c)
	ctrA := vgpuContainer("c1", pod(podA), "a", c, false)
	ctrA.Env = ctrA.Env[:len(ctrA.Env)-2] // sees GPU 0 only
	if _, err := f.create(pod(podA), ctrA); err != nil {
		t.Fatal(err)
	}
	if err := f.plugin.StopPodSandbox(context.Background(), pod(podA)); err != nil {
		t.Fatal(err)
	}
	in, ok := f.plugin.Cache().Get("c1")
	if !ok || in.State != StateStopped || exists(f.dirs(claimA, podA, "a").Root) {
		t.Errorf("after StopPodSandbox: %+v %v, dir exists %v", in, ok, exists(f.dirs(claimA, podA, "a").Root))
	}
}

func TestDeadlinePassedUndoesTheDirectory(t *testing.T) {
	c := testClaim(claimA, gpu0)
	f := newFixture(t, c)
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel()
	_, _, err := f.plugin.CreateContainer(ctx, pod(podA), vgpuContainer("c1", pod(podA), "app", c, true))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want the deadline", err)
	}
	if exists(f.dirs(claimA, podA, "app").Root) || f.plugin.Cache().Len() != 0 {
		t.Error("a late CreateContainer left its directory or entry")
	}
}

func TestSynchronizeRebuildsTheCache(t *testing.T) {
	c := testClaim(claimA, gpu0)
	c.ReservedFor = []string{podA, podB}
	f := newFixture(t, c)
	f.fakePID(77, "0::/kubepods/app.scope\n")
	ctx := context.Background()
	for _, x := range []struct{ id, pod, name string }{{"run", podA, "app"}, {"gone", podA, "old"}, {"b", podB, "app"}} {
		if _, err := f.create(pod(x.pod), vgpuContainer(x.id, pod(x.pod), x.name, c, true)); err != nil {
			t.Fatal(err)
		}
		f.plugin.StopContainer(ctx, pod(x.pod), &api.Container{Id: x.id})
	}
	replay := func(id, podUID, name string, state api.ContainerState, pid uint32) *api.Container {
		ctr := vgpuContainer(id, pod(podUID), name, c, true)
		d := f.dirs(claimA, podUID, name)
		ctr.Env = append(ctr.Env, contract.EnvPodUID+"="+podUID, contract.EnvContainerName+"="+name)
		ctr.Mounts = []*api.Mount{{Source: d.Config, Destination: contract.ContainerConfigDir, Type: "bind"}}
		ctr.State, ctr.Pid = state, pid
		return ctr
	}
	forged := vgpuContainer("forged", pod(podB), "app", c, true) // claim env only: not ours
	wrongID := replay("wrong", podB, "x", api.ContainerState_CONTAINER_RUNNING, 77)
	wrongID.Env = append(wrongID.Env, contract.EnvContainerName+"=app")
	updates, err := f.plugin.Synchronize(ctx, []*api.PodSandbox{pod(podA), pod(podB)}, []*api.Container{
		replay("run", podA, "app", api.ContainerState_CONTAINER_RUNNING, 77), forged, wrongID,
	})
	if err != nil || len(updates) != 0 {
		t.Fatalf("Synchronize: %v %v", updates, err)
	}
	list := f.plugin.Cache().List()
	if !f.plugin.Cache().Synced() || len(list) != 1 {
		t.Fatalf("cache after Synchronize: synced %v, %+v", f.plugin.Cache().Synced(), list)
	}
	if in := list[0]; in.ContainerID != "run" || in.PID != 77 || in.State != StateRunning {
		t.Errorf("replayed instance %+v", in)
	}
	// The cgroup is read after Synchronize answered.
	waitFor(t, func() bool { in, _ := f.plugin.Cache().Get("run"); return in.Cgroup.Unified == "/kubepods/app.scope" })
	if !exists(f.dirs(claimA, podA, "app").Root) || exists(f.dirs(claimA, podA, "old").Root) || exists(f.dirs(claimA, podB, "app").Root) {
		t.Error("Synchronize kept a directory the runtime no longer has, or removed a live one")
	}
}

func TestParseCgroup(t *testing.T) {
	for in, want := range map[string]Cgroup{
		"0::/a/b\n":                       {Unified: "/a/b"},
		"3:pids:/p\n1:name=systemd:/s\n":  {PIDsV1: "/p"},
		"7:cpu,pids:/x\n0::/y\ngarbage\n": {PIDsV1: "/x", Unified: "/y"},
		"":                                {},
	} {
		if got := parseCgroup([]byte(in)); got != want {
			t.Errorf("parseCgroup(%q) = %+v, want %+v", in, got, want)
		}
	}
}
