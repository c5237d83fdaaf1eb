package handover

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeOwner records the calls Serve makes, in order.
type fakeOwner struct {
	mu       sync.Mutex
	calls    []string
	refuse   error
	fenceErr error
	peerGone chan struct{}
	took     chan *Took
}

func newFakeOwner() *fakeOwner {
	return &fakeOwner{peerGone: make(chan struct{}, 4), took: make(chan *Took, 4)}
}

func (o *fakeOwner) record(s string) {
	o.mu.Lock()
	o.calls = append(o.calls, s)
	o.mu.Unlock()
}

func (o *fakeOwner) Calls() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.calls)
}

func (o *fakeOwner) Welcome(h Hello) (Welcome, error) {
	o.record("welcome " + h.PodUID)
	if o.refuse != nil {
		return Welcome{}, o.refuse
	}
	return Welcome{PodUID: "old-pod", NRIIndex: "03", NRIConnected: true}, nil
}
func (o *fakeOwner) Fence(context.Context) error { o.record("fence"); return o.fenceErr }
func (o *fakeOwner) Unfence()                    { o.record("unfence") }
func (o *fakeOwner) Release() error              { o.record("release"); return nil }
func (o *fakeOwner) Took(t *Took) Report {
	if t == nil {
		o.record("took nil")
	} else {
		o.record("took " + t.DRASocket)
	}
	o.took <- t
	return Report{Pause: 42 * time.Millisecond, HeldCalls: 3}
}
func (o *fakeOwner) PeerGone() { o.record("peer gone"); o.peerGone <- struct{}{} }

// fakeSuccessor plays the incoming instance; its hooks can fail or "die" (close the connection).
type fakeSuccessor struct {
	validate func() error
	takeOver func() (Took, error)
}

func (s fakeSuccessor) Validate() error {
	if s.validate != nil {
		return s.validate()
	}
	return nil
}

func (s fakeSuccessor) TakeOver(context.Context) (Took, error) {
	if s.takeOver != nil {
		return s.takeOver()
	}
	return Took{DRASocket: "/new/dra.sock"}, nil
}

func serve(t *testing.T, o Owner) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "vgh-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	path := filepath.Join(dir, "handover.sock")
	s, err := Listen(context.Background(), path, o, Timeouts{Fence: 200 * time.Millisecond, Commit: time.Second, Took: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return path
}

func dialHello(t *testing.T, path string) *Client {
	t.Helper()
	c, err := Dial(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	w, err := c.Hello(Hello{PodUID: "new-pod"})
	if err != nil {
		t.Fatalf("hello: %v", err)
	}
	if w.NRIIndex != "03" || !w.NRIConnected || w.PodUID != "old-pod" {
		t.Errorf("welcome = %+v", w)
	}
	return c
}

func waitGone(t *testing.T, o *fakeOwner) {
	t.Helper()
	select {
	case <-o.peerGone:
	case <-time.After(10 * time.Second):
		t.Fatalf("the owner was not told that the successor left; calls %v", o.Calls())
	}
}

// TestHandoverInOrder: the steps happen in the protocol's order and the successor gets the old
// owner's report.
func TestHandoverInOrder(t *testing.T) {
	o := newFakeOwner()
	c := dialHello(t, serve(t, o))
	r, err := c.Request(context.Background(), fakeSuccessor{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Pause != 42*time.Millisecond || r.HeldCalls != 3 {
		t.Errorf("report = %+v", r)
	}
	c.Close()
	waitGone(t, o)
	want := []string{"welcome new-pod", "fence", "release", "took /new/dra.sock", "peer gone"}
	if got := o.Calls(); !slices.Equal(got, want) {
		t.Errorf("owner calls %v, want %v", got, want)
	}
}

// TestHandoverCalledOff: every way a handover stops before the lock changed hands leaves the
// owner unfenced and serving; after the lock changed hands the owner is told that nobody took it.
func TestHandoverCalledOff(t *testing.T) {
	t.Run("successor cannot read the checkpoint", func(t *testing.T) {
		o := newFakeOwner()
		c := dialHello(t, serve(t, o))
		_, err := c.Request(context.Background(), fakeSuccessor{validate: func() error { return errors.New("checkpoint format v3") }})
		if err == nil || !strings.Contains(err.Error(), "v3") {
			t.Fatalf("Request = %v", err)
		}
		// The owner keeps the session: a later request is served.
		if _, err := c.Request(context.Background(), fakeSuccessor{}); err != nil {
			t.Fatalf("second request: %v", err)
		}
		want := []string{"welcome new-pod", "fence", "unfence", "fence", "release", "took /new/dra.sock"}
		if got := o.Calls(); !slices.Equal(got, want) {
			t.Errorf("owner calls %v, want %v", got, want)
		}
	})
	t.Run("owner cannot fence in time", func(t *testing.T) {
		o := newFakeOwner()
		o.fenceErr = context.DeadlineExceeded
		c := dialHello(t, serve(t, o))
		var abort *AbortError
		if _, err := c.Request(context.Background(), fakeSuccessor{}); !errors.As(err, &abort) || !strings.Contains(abort.Reason, "fence") {
			t.Fatalf("Request = %v, want the owner's abort naming the fence", err)
		}
		if got, want := o.Calls(), []string{"welcome new-pod", "fence", "unfence"}; !slices.Equal(got, want) {
			t.Errorf("owner calls %v, want %v", got, want)
		}
	})
	t.Run("successor dies while the owner is fenced", func(t *testing.T) {
		o := newFakeOwner()
		c := dialHello(t, serve(t, o))
		_, _ = c.Request(context.Background(), fakeSuccessor{validate: func() error { c.Close(); return errors.New("killed") }})
		waitGone(t, o)
		if got, want := o.Calls(), []string{"welcome new-pod", "fence", "unfence", "peer gone"}; !slices.Equal(got, want) {
			t.Errorf("owner calls %v, want %v", got, want)
		}
	})
	t.Run("successor dies after the lock was released", func(t *testing.T) {
		o := newFakeOwner()
		c := dialHello(t, serve(t, o))
		_, _ = c.Request(context.Background(), fakeSuccessor{takeOver: func() (Took, error) { c.Close(); return Took{}, errors.New("killed") }})
		if took := <-o.took; took != nil {
			t.Errorf("the owner was told %+v, want nobody took over", took)
		}
		waitGone(t, o)
		if got, want := o.Calls(), []string{"welcome new-pod", "fence", "release", "took nil", "peer gone"}; !slices.Equal(got, want) {
			t.Errorf("owner calls %v, want %v", got, want)
		}
	})
	t.Run("successor fails to take over and says so", func(t *testing.T) {
		o := newFakeOwner()
		c := dialHello(t, serve(t, o))
		if _, err := c.Request(context.Background(), fakeSuccessor{takeOver: func() (Took, error) { return Took{}, errors.New("open checkpoint") }}); err == nil {
			t.Fatal("Request succeeded")
		}
		if took := <-o.took; took != nil {
			t.Errorf("the owner was told %+v, want nobody took over", took)
		}
	})
}

// TestOwnerRefusals: a retired predecessor is told so; a second successor while one is served is
// refused as busy.
func TestOwnerRefusals(t *testing.T) {
	o := newFakeOwner()
	path := serve(t, o)
	first := dialHello(t, path)
	second, err := Dial(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	var refused *RefusedError
	if _, err := second.Hello(Hello{PodUID: "third"}); !errors.As(err, &refused) || refused.Retired {
		t.Errorf("a second successor's hello = %v, want refused as busy", err)
	}
	first.Close()
	waitGone(t, o)

	o.refuse = &RefusedError{Reason: "you handed this node over to me", Retired: true}
	c, err := Dial(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Hello(Hello{PodUID: "old-pod"}); !errors.As(err, &refused) || !refused.Retired {
		t.Errorf("a retired predecessor's hello = %v, want refused as retired", err)
	}
}
