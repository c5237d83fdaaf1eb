package registry_test

import (
	"context"
	"maps"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"

	vgpumetrics "github.com/vgpu-dra/vgpu-dra/pkg/metrics"
	basemetrics "k8s.io/component-base/metrics"
)

func registerOnce(t testing.TB, sock string, r registry.Request) registry.Response {
	t.Helper()
	resp, err := (&registry.Client{Socket: sock}).RegisterOnce(context.Background(), r)
	if err != nil {
		t.Fatalf("register at %s: %v", sock, err)
	}
	return resp
}

// waitFor polls cond; the bound only turns a hang into a failure, it is not asserted timing.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// TestSocketModes: directory 0711, socket 0666, no staged name left behind.
func TestSocketModes(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	dir := filepath.Join(shortDir(t), "registry")
	if err := os.MkdirAll(dir, 0o755); err != nil { // a wrong mode is fixed
		t.Fatal(err)
	}
	s := startServer(t, registry.Config{Socket: filepath.Join(dir, "registry.sock")}, registry.Deps{Cgroups: &h})
	dst, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	sst, err := os.Lstat(s.Socket())
	if err != nil {
		t.Fatal(err)
	}
	if dst.Mode().Perm() != 0o711 || sst.Mode()&os.ModeSocket == 0 || sst.Mode().Perm() != 0o666 {
		t.Fatalf("dir %v, socket %v; want 0711 and a 0666 socket", dst.Mode(), sst.Mode())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("registry dir holds %d entries, want only the socket", len(entries))
	}
	s.Stop()
	if _, err := os.Lstat(s.Socket()); !os.IsNotExist(err) {
		t.Fatalf("socket left after Stop: %v", err)
	}
}

// TestSocketTakeover: a second server on the same path takes the socket over by rename;
// clients reach it; the first one's Stop leaves the successor's socket in place and its
// health check reports that the socket is no longer its own.
func TestSocketTakeover(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	sock := filepath.Join(shortDir(t), "registry", "registry.sock")
	first := newContainers()
	first.set(podA, "app", registry.Container{}, false) // answers RETRY for others
	second := newContainers()
	second.set(podB, "x", registry.Container{}, true) // answers NOT_FOUND
	a := startServer(t, registry.Config{Socket: sock, WatchInterval: 10 * time.Millisecond}, registry.Deps{Containers: first, Cgroups: &h})
	req := registry.Request{PodUID: podB, ContainerName: "app"}
	if r := registerOnce(t, sock, req); r.Status != registry.StatusRetry {
		t.Fatalf("first server: %+v", r)
	}
	b := startServer(t, registry.Config{Socket: sock}, registry.Deps{Containers: second, Cgroups: &h})
	if r := registerOnce(t, sock, req); r.Status != registry.StatusNotFound {
		t.Fatalf("after takeover: %+v, want the second server's NOT_FOUND", r)
	}
	waitFor(t, "the first server to notice the takeover", func() bool { return a.Check(context.Background()) != nil })
	a.Stop()
	if r := registerOnce(t, sock, req); r.Status != registry.StatusNotFound {
		t.Fatalf("after the first server stopped: %+v", r)
	}
	if err := b.Check(context.Background()); err != nil {
		t.Fatalf("successor's health: %v", err)
	}
}

// TestSocketRecreated: a removed socket is put back and served.
func TestSocketRecreated(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	cs := newContainers()
	cs.set(podB, "x", registry.Container{}, true)
	s := startServer(t, registry.Config{WatchInterval: 10 * time.Millisecond}, registry.Deps{Containers: cs, Cgroups: &h})
	if err := os.Remove(s.Socket()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the socket to be re-created", func() bool { _, err := os.Lstat(s.Socket()); return err == nil })
	if r := registerOnce(t, s.Socket(), registry.Request{PodUID: podA, ContainerName: "app"}); r.Status != registry.StatusNotFound {
		t.Fatalf("re-created socket: %+v", r)
	}
	if err := s.Check(context.Background()); err != nil {
		t.Fatalf("health after re-creation: %v", err)
	}
}

// TestCheckAndMetrics: the health probe answers and is not counted; registrations are
// counted by status with their duration; stalled connections count as NO_RESPONSE.
func TestCheckAndMetrics(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	reg := basemetrics.NewKubeRegistry()
	m := vgpumetrics.NewRegistryMetrics(reg)
	cs := newContainers()
	s := startServer(t, registry.Config{HeaderTimeout: 50 * time.Millisecond}, registry.Deps{Containers: cs, Cgroups: &h, Metrics: m})
	for range 3 {
		if err := s.Check(context.Background()); err != nil {
			t.Fatalf("health: %v", err)
		}
	}
	registerOnce(t, s.Socket(), registry.Request{PodUID: podA, ContainerName: "app"}) // RETRY: not synced
	cs.set(podB, "x", registry.Container{}, true)
	registerOnce(t, s.Socket(), registry.Request{PodUID: podA, ContainerName: "app"}) // NOT_FOUND
	exchange(t, s.Socket(), hdr(1, 5000), false)                                      // INVALID
	exchange(t, s.Socket(), []byte("VG"), false)                                      // stalls: NO_RESPONSE
	counts, samples := gatherRegistry(t, reg)
	want := map[string]float64{"INVALID": 1, "NOT_FOUND": 1, "NO_RESPONSE": 1, "RETRY": 1}
	if !maps.Equal(counts, want) {
		t.Fatalf("registry_requests_total = %v, want %v", counts, want)
	}
	if samples != 3 {
		t.Fatalf("registry_request_duration_seconds has %d samples, want 3", samples)
	}
	s.Stop()
	if err := s.Check(context.Background()); err == nil {
		t.Fatal("health of a stopped server passed")
	}
}

// gatherRegistry reads registry_requests_total by status and the duration sample count.
func gatherRegistry(t testing.TB, reg basemetrics.KubeRegistry) (map[string]float64, uint64) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]float64{}
	var samples uint64
	for _, f := range fams {
		switch f.GetName() {
		case "vgpu_dra_registry_requests_total":
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "status" {
						counts[l.GetValue()] = m.GetCounter().GetValue()
					}
				}
			}
		case "vgpu_dra_registry_request_duration_seconds":
			for _, m := range f.GetMetric() {
				samples += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return counts, samples
}

// TestYieldAnswersWhatItAcceptedAndLeavesThePath: the handover of the socket (contract §14).
// A registration that had reached the outgoing server is answered by it, with its own answer;
// from the yield on the outgoing server takes no new connection (a connect to its socket is
// refused, which the client retries) and never touches the path again; new connections reach
// the successor, whose socket the outgoing server's Stop leaves alone.
func TestYieldAnswersWhatItAcceptedAndLeavesThePath(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	sock := filepath.Join(shortDir(t), "registry", "registry.sock")
	oldCs := newContainers()
	oldCs.set(podB, "x", registry.Container{}, true) // the outgoing owner answers NOT_FOUND
	newCs := newContainers()
	newCs.set(podB, "y", registry.Container{}, false) // the successor answers RETRY (unsynced)
	// A watch that never runs during the test: the yield alone must retire the listener.
	old := startServer(t, registry.Config{Socket: sock, WatchInterval: time.Hour}, registry.Deps{Containers: oldCs, Cgroups: &h})
	req := wellFormed(t, registry.Request{PodUID: podA, ContainerName: "app"})
	inFlight, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inFlight.Write(req[:5]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the outgoing server to accept the connection", func() bool { return old.OpenConnections() == 1 })
	old.Yield()
	resp, err := readAnswer(inFlight, req[5:])
	if err != nil || resp.Status != registry.StatusNotFound {
		t.Fatalf("the registration in flight at the handover: %+v, %v; want the outgoing server's NOT_FOUND", resp, err)
	}
	if c, err := net.Dial("unix", sock); err == nil {
		_ = c.Close()
		t.Fatal("the yielded server still takes connections")
	}
	succ := startServer(t, registry.Config{Socket: sock}, registry.Deps{Containers: newCs, Cgroups: &h})
	if r := registerOnce(t, sock, registry.Request{PodUID: podA, ContainerName: "app"}); r.Status != registry.StatusRetry {
		t.Fatalf("a registration after the handover: %+v, want the successor's RETRY", r)
	}
	if err := old.Check(context.Background()); err == nil {
		t.Error("the outgoing server's health check still claims the socket")
	}
	old.Stop()
	if err := succ.Check(context.Background()); err != nil {
		t.Fatalf("the successor's socket after the outgoing server stopped: %v", err)
	}
}
