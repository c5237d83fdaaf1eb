package registry_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

func hdr(kind uint8, length uint32) []byte {
	b := append([]byte("VGPR"), 1, kind, 0, 0)
	return binary.BigEndian.AppendUint32(b, length)
}

func wellFormed(t testing.TB, r registry.Request) []byte {
	b, err := registry.AppendRequest(nil, r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// exchange sends raw bytes (then optionally shuts down its write side) and reads what the
// server answers until it closes. It returns the decoded response, or ok=false if the
// server closed without one.
func exchange(t testing.TB, sock string, send []byte, closeWrite bool) (registry.Response, bool) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(send); err != nil {
		t.Fatal(err)
	}
	if closeWrite {
		_ = c.(*net.UnixConn).CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	all, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	if len(all) == 0 {
		return registry.Response{}, false
	}
	_, v, err := registry.ParseFrame(all)
	if err != nil {
		t.Fatalf("answer %x: %v", all, err)
	}
	return v.(registry.Response), true
}

// TestMalformedFrames: every frame that breaks a rule gets INVALID and the connection is
// closed; a peer cut short mid-frame gets INVALID too; bytes after a frame are ignored.
func TestMalformedFrames(t *testing.T) {
	cs := newContainers()
	cs.set(podB, "x", registry.Container{}, true) // synced, nothing of podA
	h := rt.Hierarchies(t)[0]
	s := startServer(t, registry.Config{}, registry.Deps{Containers: cs, Cgroups: &h})
	good := wellFormed(t, registry.Request{PodUID: podA, ContainerName: "app"})
	field := func(tag uint8, v string) []byte {
		b := binary.BigEndian.AppendUint16([]byte{tag}, uint16(len(v)))
		return append(b, v...)
	}
	withBody := func(body []byte) []byte { return append(hdr(1, uint32(len(body))), body...) }
	cases := []struct {
		name       string
		send       []byte
		closeWrite bool
		want       registry.Status
	}{
		{"bad magic", append([]byte("XGPR"), good[4:]...), false, registry.StatusInvalid},
		{"version 2", append(append([]byte("VGPR"), 2), good[5:]...), false, registry.StatusInvalid},
		{"reserved set", append(append([]byte("VGPR"), 1, 1, 0, 1), good[8:]...), false, registry.StatusInvalid},
		{"oversized length", hdr(1, 4097), false, registry.StatusInvalid},
		{"huge length", hdr(1, 0xffffffff), false, registry.StatusInvalid},
		{"response kind", append(hdr(2, 2), 0, 0), false, registry.StatusInvalid},
		{"empty body", hdr(1, 0), false, registry.StatusInvalid},
		{"repeated tag", withBody(bytes.Join([][]byte{field(1, podA), field(2, "app"), field(2, "app")}, nil)), false, registry.StatusInvalid},
		{"field overruns body", withBody(append(field(1, podA), 2, 0, 9, 'a')), false, registry.StatusInvalid},
		{"upper-case UUID", withBody(append(field(1, strings.ToUpper(podA)), field(2, "app")...)), false, registry.StatusInvalid},
		{"bad container name", withBody(append(field(1, podA), field(2, "App_1")...)), false, registry.StatusInvalid},
		{"client_version of 65", withBody(bytes.Join([][]byte{field(1, podA), field(2, "app"), field(4, strings.Repeat("v", 65))}, nil)), false, registry.StatusInvalid},
		{"truncated header", good[:7], true, registry.StatusInvalid},
		{"truncated body", good[:len(good)-3], true, registry.StatusInvalid},
		{"header, no body", good[:12], true, registry.StatusInvalid},
		{"well-formed", good, false, registry.StatusNotFound},
		{"trailing bytes ignored", append(append([]byte(nil), good...), bytes.Repeat([]byte("junk"), 3000)...), false, registry.StatusNotFound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, ok := exchange(t, s.Socket(), c.send, c.closeWrite)
			if !ok || resp.Status != c.want {
				t.Fatalf("answered=%v %+v, want %v", ok, resp, c.want)
			}
		})
	}
	// A peer that connects and goes away at once gets nothing (and costs nothing).
	if _, ok := exchange(t, s.Socket(), nil, true); ok {
		t.Fatal("an empty connection got an answer")
	}
}

// TestSlowPeersAreClosedUnansweredWhileOthersAreServed: a header trickled byte by byte that
// then stalls, and a body that stalls, are closed without a response once their deadline
// passes; meanwhile well-formed registrations are answered.
func TestSlowPeersAreClosedUnansweredWhileOthersAreServed(t *testing.T) {
	cs := newContainers()
	cs.set(podB, "x", registry.Container{}, true)
	h := rt.Hierarchies(t)[0]
	s := startServer(t, registry.Config{}, registry.Deps{Containers: cs, Cgroups: &h}) // contract deadlines: 2 s + 2 s
	good := wellFormed(t, registry.Request{PodUID: podA, ContainerName: "app"})

	type slow struct {
		name string
		send []byte
	}
	var wg sync.WaitGroup
	closed := make(chan string, 2)
	for _, sl := range []slow{{"header", good[:9]}, {"body", good[:20]}} {
		c, err := net.Dial("unix", s.Socket())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		wg.Go(func() {
			for i := range sl.send { // byte by byte, then stall
				if _, err := c.Write(sl.send[i : i+1]); err != nil {
					t.Errorf("%s: write: %v", sl.name, err)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			b, err := io.ReadAll(c)
			if err != nil || len(b) != 0 {
				t.Errorf("stalled %s: got %x, %v; want a close without a response", sl.name, b, err)
			}
			closed <- sl.name
		})
	}
	// While both stall, others are served.
	for range 5 {
		resp, err := (&registry.Client{Socket: s.Socket()}).RegisterOnce(context.Background(), registry.Request{PodUID: podA, ContainerName: "app"})
		if err != nil || resp.Status != registry.StatusNotFound {
			t.Fatalf("well-formed registration during the stall: %+v, %v", resp, err)
		}
		select {
		case name := <-closed:
			t.Fatalf("stalled %s was closed before the others were served", name)
		default:
		}
	}
	wg.Wait()
}

// TestStalledFloodDoesNotBlockRegistration: 1,000 connections each send one byte and stall;
// a well-formed registration of another caller meanwhile is answered (its latency is
// measured by the benchmark, not asserted here).
func TestStalledFloodDoesNotBlockRegistration(t *testing.T) {
	cs := newContainers()
	cs.set(podB, "x", registry.Container{}, true)
	h := rt.Hierarchies(t)[0]
	s := startServer(t, registry.Config{}, registry.Deps{Containers: cs, Cgroups: &h})
	rt.Flood(t, s.Socket(), 1000)
	other := rt.StartChild(t, rt.NewCgroup(t, h), rt.Spec{Socket: s.Socket(), Count: 1, Budget: oneAttempt,
		Request: registry.Request{PodUID: podA, ContainerName: "app"}})
	if rep := other.Report(t); rep.Statuses[0] != "NOT_FOUND" {
		t.Fatalf("registration during a flood of stalled connections: %s %s", rep.Statuses[0], rep.Messages[0])
	}
}

// TestOpenConnectionBound: past MaxOpenConns a new connection is answered BUSY with
// retry_after_ms, without being read.
func TestOpenConnectionBound(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	s := startServer(t, registry.Config{MaxOpenConns: 4}, registry.Deps{Containers: newContainers(), Cgroups: &h})
	rt.Flood(t, s.Socket(), 4)
	resp, err := (&registry.Client{Socket: s.Socket()}).RegisterOnce(context.Background(), registry.Request{PodUID: podA, ContainerName: "app"})
	if err != nil || resp.Status != registry.StatusBusy || !resp.HasRetryAfter {
		t.Fatalf("fifth connection: %+v, %v; want BUSY with retry_after_ms", resp, err)
	}
}

// TestRequestBounds: whole requests in flight are bounded globally and per caller — the
// container the connecting process is in, whatever pod its requests name; over the global
// bound the answer is BUSY with retry_after_ms at once, over the caller's once it waited
// LockTimeout for one of its caller's slots (TestInFlightQueue: the queue), and the slots come
// back when the requests finish.
func TestRequestBounds(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	podC := "4f9e5a6b-7c8d-4e9f-a0b1-c2d3e4f5a6b7"
	podD := "5a0f6b7c-8d9e-4fa0-b1c2-d3e4f5a6b7c8"
	type call struct {
		caller int // index of the caller's cgroup
		pod    string
	}
	for _, bound := range []struct {
		name    string
		cfg     registry.Config
		hold    []call // held in flight
		busy    []call // then BUSY
		notBusy []call // then answered normally
	}{
		{"global", registry.Config{MaxRequests: 2, MaxRequestsPerCaller: 2},
			[]call{{0, podA}, {0, podB}}, []call{{0, podC}, {1, podC}}, nil},
		{"per caller", registry.Config{MaxRequests: 8, MaxRequestsPerCaller: 1, LockTimeout: 100 * time.Millisecond},
			[]call{{0, podA}, {1, podB}}, []call{{0, podC}, {1, podC}}, []call{{2, podC}}},
	} {
		t.Run(bound.name, func(t *testing.T) {
			callers := []rt.Cgroup{rt.NewCgroup(t, h), rt.NewCgroup(t, h), rt.NewCgroup(t, h)}
			cs := newContainers()
			cs.set(podD, "x", registry.Container{}, true)
			release := make(chan struct{})
			entered := make(chan struct{}, 8)
			held := []string{}
			for _, c := range bound.hold {
				held = append(held, c.pod)
			}
			cs.hook = func(pod string) {
				if slices.Contains(held, pod) {
					entered <- struct{}{}
					<-release
				}
			}
			s := startServer(t, bound.cfg, registry.Deps{Containers: cs, Cgroups: &h})
			start := func(c call) *rt.Child {
				return rt.StartChild(t, callers[c.caller], rt.Spec{Socket: s.Socket(), Count: 1, Budget: oneAttempt,
					Request: registry.Request{PodUID: c.pod, ContainerName: "app"}})
			}
			expect := func(what string, c call, want registry.Status) {
				t.Helper()
				rep := start(c).Report(t)
				if rep.Statuses[0] != want.String() {
					t.Errorf("%s: caller %d naming pod %s: %s %s; want %v", what, c.caller, c.pod, rep.Statuses[0], rep.Messages[0], want)
				}
			}
			var holders []*rt.Child
			for _, c := range bound.hold {
				holders = append(holders, start(c))
				<-entered
			}
			for _, c := range bound.busy {
				expect("while "+fmt.Sprint(bound.hold)+" are held", c, registry.StatusBusy)
			}
			for _, c := range bound.notBusy {
				expect("while "+fmt.Sprint(bound.hold)+" are held", c, registry.StatusNotFound)
			}
			close(release)
			for _, ch := range holders {
				if rep := ch.Report(t); rep.Statuses[0] != "NOT_FOUND" {
					t.Errorf("held request: %s %s", rep.Statuses[0], rep.Messages[0])
				}
			}
			for _, c := range bound.busy {
				expect("after the bound cleared", c, registry.StatusNotFound)
			}
		})
	}
}

// TestPanicIsInternal: a panic while handling a request is answered INTERNAL and the server
// goes on serving.
func TestPanicIsInternal(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	cs := newContainers()
	cs.set(podB, "x", registry.Container{}, true)
	cs.hook = func(string) { panic("resolver bug") }
	s := startServer(t, registry.Config{}, registry.Deps{Containers: cs, Cgroups: &h})
	c := &registry.Client{Socket: s.Socket()}
	r, err := c.RegisterOnce(context.Background(), registry.Request{PodUID: podA, ContainerName: "app"})
	if err != nil || r.Status != registry.StatusInternal {
		t.Fatalf("panicking resolver: %+v, %v; want INTERNAL", r, err)
	}
	cs.mu.Lock()
	cs.hook = nil
	cs.mu.Unlock()
	if r, err := c.RegisterOnce(context.Background(), registry.Request{PodUID: podA, ContainerName: "app"}); err != nil || r.Status != registry.StatusNotFound {
		t.Fatalf("after a panic: %+v, %v", r, err)
	}
}

// TestConcurrentRegistrations: 256 registrations at once from one container (the retrying
// client, as the library's) — every one answered OK, none lost.
func TestConcurrentRegistrations(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	ctr := rt.NewCgroup(t, h)
	dir := configDir(t, shortDir(t), "c")
	cs := newContainers()
	cs.set(podA, "app", registry.Container{ConfigDir: dir, Cgroup: ctr.Path}, true)
	s := startServer(t, registry.Config{}, registry.Deps{Containers: cs, Cgroups: &h})
	ch := rt.StartChild(t, ctr, rt.Spec{Socket: s.Socket(), Count: 256, Request: registry.Request{PodUID: podA, ContainerName: "app"}})
	rep := ch.Report(t)
	for i, st := range rep.Statuses {
		if st != "OK" {
			t.Errorf("registration %d: %s %s", i, st, rep.Messages[i])
		}
	}
	if len(rep.Statuses) != 256 {
		t.Fatalf("%d answers, want 256", len(rep.Statuses))
	}
	if got := readPIDs(t, dir); len(got) != 1 || got[0] != ch.PID {
		t.Fatalf("pids.config = %v, want [%d]", got, ch.PID)
	}
}

// TestBusyEvenWhenBusyAnswersAreSaturated: past MaxOpenConns and with the bounded BUSY
// answerers all lingering on connections that never read, a new connection still gets BUSY
// (contract §5), not a close without an answer that the client would take as final.
func TestBusyEvenWhenBusyAnswersAreSaturated(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	s := startServer(t, registry.Config{MaxOpenConns: 4}, registry.Deps{Containers: newContainers(), Cgroups: &h})
	rt.Flood(t, s.Socket(), 4)
	rt.Flood(t, s.Socket(), 300) // each answered BUSY by a goroutine that lingers: more than its bound
	for i := range 5 {
		resp, err := (&registry.Client{Socket: s.Socket()}).RegisterOnce(context.Background(), registry.Request{PodUID: podA, ContainerName: "app"})
		if err != nil || resp.Status != registry.StatusBusy || !resp.HasRetryAfter {
			t.Fatalf("connection %d over a saturated server: %+v, %v; want BUSY with retry_after_ms", i, resp, err)
		}
	}
}
