package registry_test

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
	rt "github.com/vgpu-dra/vgpu-dra/pkg/registry/registrytest"
)

func TestRetryWait(t *testing.T) {
	none := func(time.Duration) time.Duration { return 0 }
	all := func(m time.Duration) time.Duration { return m }
	huge := func(time.Duration) time.Duration { return time.Hour }
	ms := time.Millisecond
	for _, c := range []struct {
		resp   *registry.Response
		jitter func(time.Duration) time.Duration
		want   time.Duration
	}{
		{nil, none, 100 * ms},
		{nil, all, 125 * ms},
		{&registry.Response{Status: registry.StatusRetry}, none, 100 * ms},
		{&registry.Response{HasRetryAfter: true, RetryAfter: 400 * ms}, all, 500 * ms},
		{&registry.Response{HasRetryAfter: true, RetryAfter: 400 * ms}, huge, 500 * ms},
		{&registry.Response{HasRetryAfter: true, RetryAfter: 0}, none, 10 * ms},
		{&registry.Response{HasRetryAfter: true, RetryAfter: 3 * ms}, all, 12*ms + 500*time.Microsecond},
	} {
		if got := registry.RetryWait(c.resp, c.jitter); got != c.want {
			t.Errorf("RetryWait(%+v) = %v, want %v", c.resp, got, c.want)
		}
	}
}

// TestClientRetries: a missing socket is retried until the budget would be crossed; RETRY
// is retried until the server answers something final.
func TestClientRetries(t *testing.T) {
	var slept []time.Duration
	fake := func(_ context.Context, d time.Duration) error { slept = append(slept, d); return nil }
	missing := &registry.Client{Socket: filepath.Join(shortDir(t), "none.sock"), Budget: 50 * time.Millisecond, Sleep: fake}
	res, err := missing.Register(context.Background(), registry.Request{PodUID: podA, ContainerName: "app"})
	var ce *registry.ConnectError
	if !errors.As(err, &ce) || res.ConnectFailures != res.Attempts || res.Attempts != 1 {
		// The first wait (≥100 ms) already crosses a 50 ms budget: one attempt, no sleep.
		t.Fatalf("missing socket: %+v, %v", res, err)
	}

	h := rt.Hierarchies(t)[0]
	cs := newContainers()
	s := startServer(t, registry.Config{RetryAfterUnsynced: 10 * time.Millisecond}, registry.Deps{Containers: cs, Cgroups: &h})
	slept = nil
	calls := 0
	c := &registry.Client{Socket: s.Socket(), Sleep: func(ctx context.Context, d time.Duration) error {
		calls++
		if calls == 3 {
			cs.set(podB, "x", registry.Container{}, true) // synced: the next answer is final
		}
		return fake(ctx, d)
	}}
	res, err = c.Register(context.Background(), registry.Request{PodUID: podA, ContainerName: "app"})
	if err != nil || res.Response.Status != registry.StatusNotFound || res.Attempts != 4 || len(res.Waits) != 3 {
		t.Fatalf("retrying client: %+v, %v", res, err)
	}
	for _, w := range res.Waits {
		if w < 10*time.Millisecond || w > 12*time.Millisecond+500*time.Microsecond {
			t.Fatalf("wait %v outside retry_after_ms plus a quarter", w)
		}
	}
}

// TestClientRetriesADroppedConnection: a connection closed before a byte of an answer (a
// plugin killed with the request accepted) is retried like a failed connect; a response cut
// short after its header stays final.
func TestClientRetriesADroppedConnection(t *testing.T) {
	// serve answers the n-th connection with script[n] (the last one repeating): "close"
	// closes after reading the request, "header" writes only a response header, "ok" answers OK.
	serve := func(t *testing.T, script ...string) string {
		sock := filepath.Join(shortDir(t), "r.sock")
		l, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for n := 0; ; n++ {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				_, _ = conn.Read(make([]byte, 4096))
				full := registry.AppendResponse(nil, registry.Response{Status: registry.StatusOK})
				switch script[min(n, len(script)-1)] {
				case "header":
					_, _ = conn.Write(full[:contract.RegistryHeaderLen])
				case "ok":
					_, _ = conn.Write(full)
				}
				conn.Close()
			}
		}()
		return sock
	}
	noSleep := func(context.Context, time.Duration) error { return nil }
	req := registry.Request{PodUID: podA, ContainerName: "app"}

	c := &registry.Client{Socket: serve(t, "close", "close", "ok"), Sleep: noSleep}
	res, err := c.Register(context.Background(), req)
	if err != nil || res.Response.Status != registry.StatusOK || res.Attempts != 3 || res.Dropped != 2 {
		t.Fatalf("dropped twice, then OK: %+v, %v", res, err)
	}
	for _, w := range res.Waits {
		if w < 100*time.Millisecond || w > 125*time.Millisecond {
			t.Fatalf("wait %v after a dropped connection: want a failed connect's 100 ms plus a quarter", w)
		}
	}

	c = &registry.Client{Socket: serve(t, "close"), Budget: 50 * time.Millisecond, Sleep: noSleep}
	res, err = c.Register(context.Background(), req)
	var de *registry.DroppedError
	if !errors.As(err, &de) || res.Dropped != 1 {
		t.Fatalf("always dropped, 50 ms budget: %+v, %v; want a *DroppedError after one attempt", res, err)
	}

	c = &registry.Client{Socket: serve(t, "header", "ok"), Sleep: noSleep}
	res, err = c.Register(context.Background(), req)
	if err == nil || errors.As(err, &de) || !errors.Is(err, io.ErrUnexpectedEOF) || res.Attempts != 1 {
		t.Fatalf("a response cut after its header: %+v, %v; want a final error", res, err)
	}
}
