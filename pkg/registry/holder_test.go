package registry_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

// TestVerifyHolderDecides: a claim with VerifyHolder (the device plugin's shares) is decided by
// it alone: the pod it confirms registers, a pod it denies is DENIED although the claim's
// reservedFor lists it, and a check that cannot tell is RETRY with retry_after_ms. The check is
// asked with the pod the caller's cgroup names, never the pod the request claims.
func TestVerifyHolderDecides(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	kube := rt.NewCgroup(t, h)
	ctrA := kube.Sub(t, "kubepods/besteffort/pod"+podA+"/ctr-a")
	ctrB := kube.Sub(t, "kubepods/besteffort/pod"+podB+"/ctr-b")
	ctrX := kube.Sub(t, "kubepods/pod"+uuidR+"/ctr-x")
	dir := configDir(t, shortDir(t), "share")

	var mu sync.Mutex
	var asked []string
	check := func(_ context.Context, pod string) error {
		mu.Lock()
		asked = append(asked, pod)
		mu.Unlock()
		switch pod {
		case podA:
			return nil
		case podB:
			return fmt.Errorf("share held by another pod: %w", registry.ErrNotHolder)
		default:
			return errors.New("the kubelet does not answer")
		}
	}
	// ReservedFor names pod B: VerifyHolder, not the list, decides.
	cl := claims{uuidR: {UID: claim, ReservedFor: []string{podB}, ConfigDir: dir, VerifyHolder: check}}
	s := startServer(t, registry.Config{}, registry.Deps{Claims: cl, Cgroups: &h})

	for _, tc := range []struct {
		name   string
		cg     rt.Cgroup
		req    registry.Request
		status string
	}{
		{"holder", ctrA, registry.Request{RegisterUUID: uuidR}, "OK"},
		{"holder naming another pod", ctrA, registry.Request{RegisterUUID: uuidR, PodUID: podB}, "OK"},
		{"not the holder, though reserved", ctrB, registry.Request{RegisterUUID: uuidR}, "DENIED"},
		{"not the holder, naming the holder", ctrB, registry.Request{RegisterUUID: uuidR, PodUID: podA}, "DENIED"},
		{"holder unknown", ctrX, registry.Request{RegisterUUID: uuidR}, "RETRY"},
	} {
		// The children live until the test ends, so that pids.config can list both holders.
		c := rt.StartChild(t, tc.cg, rt.Spec{Socket: s.Socket(), Count: 1, Once: true, Request: tc.req})
		if rep := c.Report(t); rep.Statuses[0] != tc.status {
			t.Errorf("%s: got %s %q, want %s", tc.name, rep.Statuses[0], rep.Messages[0], tc.status)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{podA, podA, podB, podB, uuidR}; !slices.Equal(asked, want) {
		t.Errorf("VerifyHolder was asked for %v, want the callers' cgroup pods %v", asked, want)
	}
	if got := readPIDs(t, dir); len(got) != 2 {
		t.Errorf("pids.config %v, want the two holder processes", got)
	}
}

// TestVerifyHolderRetryAfter: a check that cannot tell is answered RETRY with the configured
// retry_after_ms, so that the library asks again within its budget (the kubelet restarting).
func TestVerifyHolderRetryAfter(t *testing.T) {
	h := rt.Hierarchies(t)[0]
	kube := rt.NewCgroup(t, h)
	ctr := kube.Sub(t, "kubepods/pod"+podA+"/ctr")
	dir := configDir(t, shortDir(t), "share")
	down := func(context.Context, string) error { return errors.New("connection refused") }
	s := startServer(t, registry.Config{RetryAfterHolderUnknown: 70 * time.Millisecond}, registry.Deps{Claims: claims{uuidR: {UID: claim, ConfigDir: dir, VerifyHolder: down}}, Cgroups: &h})
	c := rt.StartChild(t, ctr, rt.Spec{Socket: s.Socket(), Count: 1, Once: true, Request: registry.Request{RegisterUUID: uuidR}})
	rep := c.Report(t)
	if rep.Statuses[0] != "RETRY" || rep.RetryAfterMs[0] != 70 {
		t.Fatalf("got %s retry_after_ms %d (%q), want RETRY after 70 ms", rep.Statuses[0], rep.RetryAfterMs[0], rep.Messages[0])
	}
}
