package integration

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

// TestRegistryThroughNRIEndToEnd is the whole chain in one process, as on a node: the kubelet
// prepares a claim, containerd's NRI runtime side creates the container (our plugin gives it
// its directories) and starts it with a real process in a real cgroup; that process registers
// over the registry socket with the identity NRI gave it, and pids.config in the container's
// own config directory lists its host PID. Before StartContainer the same registration is
// answered RETRY (the cgroup is not known yet), never with a wrong directory.
func TestRegistryThroughNRIEndToEnd(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	n := newNode(t)
	n.start()
	k := n.register()
	a := n.newClaim("a", allocated{request: "gpu", device: "gpu-0", memory: "4Gi", cores: 30, shareID: shareN1})
	resp := k.prepare(t, a)[string(a.UID)]
	n.waitSession(1)
	ctx := t.Context()
	pod := podOf(a)
	if err := n.nri.runPod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	adj, err := n.nri.create(ctx, pod.Id, n.vgpuContainer("ctr-1", "app", resp, string(a.UID)))
	if err != nil {
		t.Fatal(err)
	}
	req := registry.Request{ClientVersion: "integration"}
	for _, e := range adj.GetEnv() {
		switch e.Key {
		case "VGPU_POD_UID":
			req.PodUID = e.Value
		case "VGPU_CONTAINER_NAME":
			req.ContainerName = e.Value
		}
	}
	socket := filepath.Join(n.cfg.StateDir, "registry", "registry.sock")

	// Created, not started: RETRY.
	c := registry.Client{Socket: socket}
	if r, err := c.RegisterOnce(ctx, req); err != nil || r.Status != registry.StatusRetry {
		t.Fatalf("registration before StartContainer: %v %v, want RETRY", r.Status, err)
	}

	cg := rt.NewCgroup(t, h)
	initProc := rt.StartChild(t, cg, rt.Spec{})
	if err := n.nri.start(ctx, "ctr-1", uint32(initProc.PID)); err != nil {
		t.Fatal(err)
	}
	app := rt.StartChild(t, cg, rt.Spec{Socket: socket, Count: 1, Request: req})
	if rep := app.Report(t); rep.Statuses[0] != "OK" {
		t.Fatalf("registration of the started container: %s %s", rep.Statuses[0], rep.Messages[0])
	}
	config := mountsOf(adj)["/etc/vgpu-dra/config"].Source
	want := []int{initProc.PID, app.PID}
	slices.Sort(want)
	if got := readPIDList(t, config); !slices.Equal(got, want) {
		t.Errorf("pids.config in %s = %v, want the container's host PIDs %v", config, got, want)
	}

	// A process outside the container's cgroup asking for it is DENIED.
	outsider := rt.StartChild(t, rt.NewCgroup(t, h), rt.Spec{Socket: socket, Count: 1, Request: req})
	if rep := outsider.Report(t); rep.Statuses[0] != "DENIED" {
		t.Errorf("registration from another cgroup: %s, want DENIED", rep.Statuses[0])
	}
}
