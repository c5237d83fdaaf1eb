package handover

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestGateHoldsCallsUntilTheHandoverIsDecided: while closed, a new call waits; it is served here
// when the handover is called off and passed on when it happened. Close waits for the calls in
// flight, which is what makes the checkpoint final when it returns.
func TestGateHoldsCallsUntilTheHandoverIsDecided(t *testing.T) {
	for _, tc := range []struct {
		name    string
		resolve func(*Gate)
		want    Decision
	}{
		{"called off", (*Gate).Own, Local},
		{"handed over", (*Gate).Observe, Pass},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var waits []time.Duration
			g := NewGate(func(d time.Duration) { mu.Lock(); waits = append(waits, d); mu.Unlock() })
			if d, _, _ := g.Enter(context.Background()); d != Pass {
				t.Fatalf("a new gate decided %v, want pass (an instance starts as an observer)", d)
			}
			g.Own()
			d, done, err := g.Enter(context.Background())
			if err != nil || d != Local {
				t.Fatalf("owning gate: %v %v", d, err)
			}
			closed := make(chan error, 1)
			go func() { closed <- g.Close(context.Background()) }()
			select {
			case err := <-closed:
				t.Fatalf("Close returned (%v) with a call in flight", err)
			case <-time.After(50 * time.Millisecond):
			}
			held := make(chan Decision, 1)
			go func() {
				d, done, err := g.Enter(context.Background())
				if err != nil {
					t.Error(err)
				}
				done()
				held <- d
			}()
			done()
			if err := <-closed; err != nil {
				t.Fatalf("Close: %v", err)
			}
			select {
			case d := <-held:
				t.Fatalf("a call entered a closed gate: %v", d)
			case <-time.After(50 * time.Millisecond):
			}
			tc.resolve(g)
			if d := <-held; d != tc.want {
				t.Errorf("the held call was decided %v, want %v", d, tc.want)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(waits) != 1 || waits[0] <= 0 {
				t.Errorf("held-call waits reported %v, want exactly the one held call's", waits)
			}
		})
	}
}

// TestGateCloseGivesUpAtItsDeadline: a call that does not finish makes Close fail, and a held
// call whose caller gives up gets ErrUndecided, not a decision.
func TestGateCloseGivesUpAtItsDeadline(t *testing.T) {
	g := NewGate(nil)
	g.Own()
	_, done, _ := g.Enter(context.Background())
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := g.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with a call that never ends = %v, want DeadlineExceeded", err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel2()
	if _, _, err := g.Enter(ctx2); !errors.Is(err, ErrUndecided) {
		t.Errorf("Enter on a closed gate past the caller's deadline = %v, want ErrUndecided", err)
	}
}

// TestMarkersRecordDecisionsOnce: a marker is consumed once; IDs that could name another file
// are refused; Sweep removes old markers and anything else, keeps fresh ones.
func TestMarkersRecordDecisionsOnce(t *testing.T) {
	m, err := NewMarkers(filepath.Join(t.TempDir(), "nri-decided"))
	if err != nil {
		t.Fatal(err)
	}
	const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	if m.Consume(id) {
		t.Fatal("a marker nobody wrote was consumed")
	}
	if err := m.Mark(id); err != nil {
		t.Fatal(err)
	}
	if !m.Consume(id) || m.Consume(id) {
		t.Error("a marker must be consumed exactly once")
	}
	for _, bad := range []string{"", "../x", ".hidden", "a/b"} {
		if err := m.Mark(bad); err == nil {
			t.Errorf("Mark(%q) succeeded", bad)
		}
	}
	if err := m.Mark("old"); err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-time.Hour)
	if err := os.Chtimes(filepath.Join(m.Dir(), "old"), past, past); err != nil {
		t.Fatal(err)
	}
	if err := m.Mark("fresh"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(m.Dir(), "not-a-marker.d"), 0o700); err != nil {
		t.Fatal(err)
	}
	if n, err := m.Sweep(time.Minute); err != nil || n != 2 {
		t.Errorf("Sweep removed %d (%v), want the old marker and the directory", n, err)
	}
	if !m.Consume("fresh") {
		t.Error("Sweep removed a fresh marker")
	}
}

// TestRecordRoundTrip: what an owner writes into the lock file is what a successor reads; a
// holder that wrote none, or another version, is not taken for one that speaks the protocol.
func TestRecordRoundTrip(t *testing.T) {
	r := Record{Handover: Version, PodUID: "pod-a", NRIIndex: "04"}
	if got, ok := ParseRecord(r.String()); !ok || got != r {
		t.Errorf("ParseRecord(%q) = %+v, %v", r.String(), got, ok)
	}
	for _, line := range []string{"", "1234", `{"handover":2,"podUID":"x"}`, "{"} {
		if _, ok := ParseRecord(line); ok {
			t.Errorf("ParseRecord(%q) accepted a record", line)
		}
	}
}
