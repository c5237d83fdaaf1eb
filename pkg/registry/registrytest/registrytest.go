// Package registrytest gives the registry's tests real cgroups and real client processes:
// a cgroup tree created (as root) in a cgroup hierarchy and removed in t.Cleanup even when
// the test fails, and child processes — the test binary itself, re-executed — that are
// moved into a cgroup before they register over the socket with the Go client, so the
// server sees their real SO_PEERCRED and /proc/<pid>/cgroup.
//
// Child mode is selected by an environment variable and entered from this package's init,
// before the test binary's TestMain: a test package needs no hook of its own to start
// children, and does not collide with the TestMain it may already have.
package registrytest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
)

// Hierarchies returns the cgroup hierarchies of this host the registry can use: the one it
// picks by default first (v1 pids where mounted), then the unified v2 one if that is
// another. It fails the test when not root: creating cgroups needs it.
func Hierarchies(t testing.TB) []registry.CgroupHierarchy {
	t.Helper()
	RequireRoot(t)
	def, err := registry.DetectCgroupHierarchy("/proc")
	if err != nil {
		t.Fatalf("no cgroup hierarchy to test with: %v", err)
	}
	out := []registry.CgroupHierarchy{def}
	if def.V1Pids {
		if v2, ok := unified(t); ok {
			out = append(out, v2)
		}
	}
	return out
}

// unified finds a cgroup2 mount with root "/".
func unified(t testing.TB) (registry.CgroupHierarchy, bool) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	mount, ok := registry.UnifiedMount(string(b))
	return registry.CgroupHierarchy{Mount: mount, Root: "/", Proc: "/proc"}, ok
}

// RequireRoot fails (never skips) the test when it does not run as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("this test creates real cgroups and reads other processes' /proc entries: it must run as root (euid %d)", os.Geteuid())
	}
}

// Cgroup is a cgroup created for one test.
type Cgroup struct {
	H registry.CgroupHierarchy
	// Path is the cgroup as /proc/<pid>/cgroup names it.
	Path string
}

// Dir is the cgroup's directory.
func (c Cgroup) Dir() string { return filepath.Join(c.H.Mount, c.Path) }

// Sub creates (if needed) the cgroup rel below c.
func (c Cgroup) Sub(t testing.TB, rel string) Cgroup {
	t.Helper()
	sub := Cgroup{H: c.H, Path: filepath.Join(c.Path, rel)}
	if err := os.MkdirAll(sub.Dir(), 0o755); err != nil {
		t.Fatalf("create cgroup %s: %v", sub.Dir(), err)
	}
	return sub
}

// NewCgroup creates a fresh cgroup "/vgr-<random>" in h. t.Cleanup kills every process
// left in its tree and removes it, deepest first.
func NewCgroup(t testing.TB, h registry.CgroupHierarchy) Cgroup {
	t.Helper()
	RequireRoot(t)
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	c := Cgroup{H: h, Path: "/vgr-" + hex.EncodeToString(rnd[:])}
	if err := os.Mkdir(c.Dir(), 0o755); err != nil {
		t.Fatalf("create cgroup %s: %v", c.Dir(), err)
	}
	t.Cleanup(func() { removeTree(t, c.Dir()) })
	return c
}

func removeTree(t testing.TB, dir string) {
	var dirs []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for _, d := range dirs {
		b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		var err error
		// A killed process leaves its cgroup a moment after SIGKILL.
		for try := 0; try < 200; try++ {
			if err = os.Remove(dirs[i]); err == nil || errors.Is(err, fs.ErrNotExist) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("remove cgroup %s: %v", dirs[i], err)
		}
	}
}

// Move puts pid into c.
func (c Cgroup) Move(t testing.TB, pid int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(c.Dir(), "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		t.Fatalf("move pid %d into cgroup %s: %v", pid, c.Dir(), err)
	}
}

// childEnv selects child mode in a re-executed test binary.
const childEnv = "VGR_REGISTRYTEST_CHILD"

// Spec is what a child does once released: Count registrations of Request with the
// retrying client (Once: a single attempt each), by Workers goroutines (0: all at once). Count 0: it only sleeps (a
// process to fill a cgroup). Before registering it sets up what a misbehaving tenant would
// (Lock, Stall) and prints "ready" (Child.Ready).
type Spec struct {
	Socket  string
	Request registry.Request
	Count   int
	Workers int
	// Budget is the retrying client's budget; 0 is the contract's. A budget shorter than
	// any wait makes exactly one attempt.
	Budget time.Duration
	// RandomPodUID sends a fresh random pod_uid with every registration (a tenant that
	// names pods it is not in).
	RandomPodUID bool
	// Repeat makes every worker register again and again until the child is stopped; such
	// a child prints no report.
	Repeat bool
	// Lock is a file the child opens and holds flock(LOCK_SH) on until it ends (a tenant
	// holding its own pids.config).
	Lock string
	// Stall is a number of connections to Socket that each send one byte of a header and
	// then stall. StallReopen > 0: one that the server closes is opened again after that
	// pause (a tenant that keeps its flood up); 0: it is left closed.
	Stall       int
	StallReopen time.Duration
	// Once makes one attempt per registration (no retries).
	Once bool
}

// Report is what a child prints after its registrations.
type Report struct {
	PID      int
	Statuses []string // per registration: the status name, or "error: ..."
	Messages []string
	// RetryAfterMs are the answers' retry_after_ms, 0 when absent.
	RetryAfterMs []int64
	// Latencies are per registration, including retries, in nanoseconds.
	Latencies []int64
	// WallNS is the time from release to the last answer.
	WallNS int64
}

// init runs the child and exits when this process is one.
func init() {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(runChild(spec))
	}
}

func runChild(specJSON string) int {
	var spec Spec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "child spec:", err)
		return 2
	}
	in := bufio.NewReader(os.Stdin)
	if _, err := in.ReadString('\n'); err != nil { // released once moved into its cgroup
		return 2
	}
	stopped := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, in) // stay alive (and in the cgroup) until stdin closes
		close(stopped)
	}()
	if spec.Lock != "" {
		f, err := os.Open(spec.Lock)
		if err == nil {
			err = syscall.Flock(int(f.Fd()), syscall.LOCK_SH)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "child lock:", err)
			return 2
		}
		defer f.Close()
	}
	if err := stall(spec, stopped); err != nil {
		fmt.Fprintln(os.Stderr, "child stall:", err)
		return 2
	}
	fmt.Println(readyLine)
	if spec.Repeat {
		for range max(spec.Workers, spec.Count, 1) {
			go func() {
				c := registry.Client{Socket: spec.Socket, Budget: spec.Budget}
				for {
					_, _ = c.Register(context.Background(), spec.request())
				}
			}()
		}
		<-stopped
		return 0
	}
	rep := register(spec)
	if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
		return 2
	}
	<-stopped
	return 0
}

// readyLine is what a child prints once its Lock and Stall are in place.
const readyLine = "ready"

func (spec Spec) request() registry.Request {
	r := spec.Request
	if spec.RandomPodUID {
		var b [16]byte
		_, _ = rand.Read(b[:])
		b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
		h := hex.EncodeToString(b[:])
		r.PodUID = h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
	}
	return r
}

// register makes spec.Count registrations with spec.Workers workers.
func register(spec Spec) Report {
	rep := Report{PID: os.Getpid(), Statuses: make([]string, spec.Count), Messages: make([]string, spec.Count),
		RetryAfterMs: make([]int64, spec.Count), Latencies: make([]int64, spec.Count)}
	workers := spec.Workers
	if workers <= 0 {
		workers = spec.Count
	}
	next := make(chan int, spec.Count)
	for i := range spec.Count {
		next <- i
	}
	close(next)
	start := time.Now()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			c := registry.Client{Socket: spec.Socket, Budget: spec.Budget}
			for i := range next {
				t0 := time.Now()
				var resp registry.Response
				var err error
				if spec.Once {
					resp, err = c.RegisterOnce(context.Background(), spec.request())
				} else {
					var res registry.Result
					res, err = c.Register(context.Background(), spec.request())
					resp = res.Response
				}
				rep.Latencies[i] = int64(time.Since(t0))
				if err != nil {
					rep.Statuses[i] = "error: " + err.Error()
					continue
				}
				rep.Statuses[i] = resp.Status.String()
				rep.Messages[i] = resp.Message
				rep.RetryAfterMs[i] = resp.RetryAfter.Milliseconds()
			}
		})
	}
	wg.Wait()
	rep.WallNS = int64(time.Since(start))
	return rep
}

// stall opens spec.Stall stalled connections and, with StallReopen, keeps them up until
// stopped. It returns once each has been opened once.
func stall(spec Spec, stopped <-chan struct{}) error {
	var opened sync.WaitGroup
	errs := make(chan error, spec.Stall)
	for range spec.Stall {
		opened.Add(1)
		go func() {
			first := true
			for {
				c, err := net.Dial("unix", spec.Socket)
				if err == nil {
					_, err = c.Write([]byte("V"))
				}
				if first {
					first = false
					errs <- err
					opened.Done()
				}
				if c != nil {
					_, _ = io.Copy(io.Discard, c) // until the server closes it
					_ = c.Close()
				}
				if spec.StallReopen <= 0 {
					return
				}
				select {
				case <-stopped:
					return
				case <-time.After(spec.StallReopen):
				}
			}
		}()
	}
	opened.Wait()
	close(errs)
	for err := range errs {
		if err != nil && !isClosedByServer(err) {
			return err
		}
	}
	return nil
}

// isClosedByServer: the server answered (BUSY) and closed before the byte was sent.
func isClosedByServer(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)
}

// Child is a running child process.
type Child struct {
	PID   int
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
	done  chan struct{}
	ready bool
}

// StartChild starts a child in cgroup c and releases it: it registers as spec says and
// stays alive until t ends (or Stop). Its report is read by Report.
func StartChild(t testing.TB, c Cgroup, spec Spec) *Child {
	t.Helper()
	b, _ := json.Marshal(spec)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// The race detector sleeps 1 s at exit by default: children exit often.
	cmd.Env = append(os.Environ(), childEnv+"="+string(b), "GORACE=atexit_sleep_ms=0 "+os.Getenv("GORACE"))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child: %v", err)
	}
	ch := &Child{PID: cmd.Process.Pid, cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout), done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(ch.done) }()
	t.Cleanup(ch.Stop)
	c.Move(t, ch.PID)
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatalf("release child: %v", err)
	}
	return ch
}

// Ready waits until the child has its Lock and Stall in place.
func (ch *Child) Ready(t testing.TB) {
	t.Helper()
	line, err := ch.out.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != readyLine {
		t.Fatalf("child %d is not ready: %q, %v", ch.PID, line, err)
	}
	ch.ready = true
}

// Report waits for the child's report (its registrations done).
func (ch *Child) Report(t testing.TB) Report {
	t.Helper()
	if !ch.ready {
		ch.Ready(t)
	}
	line, err := ch.out.ReadString('\n')
	if err != nil {
		t.Fatalf("child %d gave no report: %v", ch.PID, err)
	}
	var rep Report
	if err := json.Unmarshal([]byte(line), &rep); err != nil {
		t.Fatalf("child report %q: %v", line, err)
	}
	return rep
}

// Stop ends the child (stdin closed, SIGKILL after 5 s) and reaps it. Safe to call twice.
func (ch *Child) Stop() {
	_ = ch.stdin.Close()
	select {
	case <-ch.done:
		return
	case <-time.After(5 * time.Second):
	}
	_ = ch.cmd.Process.Kill()
	<-ch.done
}

// Flood opens n connections to sock from this process that each send one byte of a header
// and stall; they are closed when the test ends. The server may answer one BUSY and close
// it (over a bound) before the byte is sent.
func Flood(t testing.TB, sock string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	for range n {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatalf("flood connection %d: %v", len(conns), err)
		}
		conns = append(conns, c)
		if _, err := c.Write([]byte("V")); err != nil && !isClosedByServer(err) {
			t.Fatalf("flood connection %d: %v", len(conns), err)
		}
	}
	return conns
}
