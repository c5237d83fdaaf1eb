package instancelock

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSecondInstanceWaits runs the holder in another process (flock is per open file
// description, so two Acquires in one process would contend too, but a real second
// instance is a second process) and checks that a waiter gets the lock only after it exits.
func TestSecondInstanceWaits(t *testing.T) {
	if os.Getenv("INSTANCELOCK_HOLDER") != "" {
		holdAndWait(os.Getenv("INSTANCELOCK_HOLDER"))
		return
	}
	path := filepath.Join(t.TempDir(), "plugins", "vgpu.dra.dev", "instance.lock")
	holder := exec.Command(os.Args[0], "-test.run=^TestSecondInstanceWaits$")
	holder.Env = append(os.Environ(), "INSTANCELOCK_HOLDER="+path)
	stdin, err := holder.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	buf := make([]byte, 6)
	if _, err := stdout.Read(buf); err != nil || string(buf[:5]) != "held\n" {
		t.Fatalf("holder did not report the lock: %q %v", buf, err)
	}
	b, _ := os.ReadFile(path)
	if strings.TrimSpace(string(b)) != strconv.Itoa(holder.Process.Pid) {
		t.Errorf("lock file holds %q, want the holder's PID %d", b, holder.Process.Pid)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	_, err = Acquire(ctx, path)
	cancel()
	if err == nil {
		t.Fatal("a second instance got the lock while the first held it")
	}

	got := make(chan *Lock, 1)
	go func() {
		l, err := Acquire(context.Background(), path)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	select {
	case <-got:
		t.Fatal("waiter got the lock before the holder exited")
	case <-time.After(400 * time.Millisecond):
	}
	_ = stdin.Close() // holder exits
	l := <-got
	defer l.Release()
	b, _ = os.ReadFile(path)
	if strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Errorf("lock file holds %q after takeover, want %d", b, os.Getpid())
	}
}

func holdAndWait(path string) {
	l, err := Acquire(context.Background(), path)
	if err != nil {
		os.Exit(3)
	}
	os.Stdout.WriteString("held\n")
	_, _ = os.Stdin.Read(make([]byte, 1))
	_ = l.Release()
	os.Exit(0)
}

// TestTryAcquireAnswersAtOnce: while the lock is held (by another open file description, as a
// second process would hold it) TryAcquire says so without waiting, and gets it once it is
// released. The holder's record is what a later reader sees.
func TestTryAcquireAnswersAtOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "instance.lock")
	first, err := TryAcquire(path)
	if err != nil {
		t.Fatal(err)
	}
	first.SetRecord(`{"handover":1,"podUID":"p-1"}`)
	if _, err := TryAcquire(path); !errors.Is(err, ErrHeld) {
		t.Fatalf("TryAcquire of a held lock = %v, want ErrHeld", err)
	}
	h := ReadHolder(path)
	if h.PID != strconv.Itoa(os.Getpid()) || h.Record != `{"handover":1,"podUID":"p-1"}` {
		t.Errorf("ReadHolder = %+v, want this PID and the record", h)
	}
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	second, err := TryAcquire(path)
	if err != nil {
		t.Fatalf("TryAcquire after release: %v", err)
	}
	defer second.Release()
	if h := ReadHolder(path); h.Record != "" {
		t.Errorf("a new holder without a record left the old one in the file: %+v", h)
	}
}

// TestReadHolderOfMissingFile: nobody has held the lock yet.
func TestReadHolderOfMissingFile(t *testing.T) {
	if h := ReadHolder(filepath.Join(t.TempDir(), "none")); h.PID != "unknown" || h.Record != "" {
		t.Errorf("ReadHolder of a missing file = %+v", h)
	}
}
