package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/plugin"
)

// childRoleEnv selects what a re-executed test binary does instead of running tests.
const childRoleEnv = "VGPU_TEST_CHILD"

// TestMain lets tests run parts in child processes (a runtime that can be SIGKILLed, a second
// plugin process) by re-executing the test binary.
func TestMain(m *testing.M) {
	var err error
	switch os.Getenv(childRoleEnv) {
	case "":
		os.Exit(m.Run())
	case "nri-runtime":
		err = runtimeChild()
	case "plugin":
		err = pluginChild()
	default:
		err = fmt.Errorf("unknown child role %q", os.Getenv(childRoleEnv))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// child is a re-executed test binary, stopped by PID (SIGKILL) at cleanup.
type child struct {
	t   testing.TB
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startChild(t testing.TB, role string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{childRoleEnv + "=" + role}, env...)...)
	cmd.Stderr = &prefixWriter{t: t, prefix: role + ": "}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child %s: %v", role, err)
	}
	c := &child{t: t, cmd: cmd, in: in, out: bufio.NewReaderSize(out, 1<<20)}
	t.Cleanup(c.kill)
	return c
}

// line waits for the next line the child prints, failing the test after timeout.
func (c *child) line(timeout time.Duration) string {
	c.t.Helper()
	ch := make(chan string, 1)
	go func() {
		s, _ := c.out.ReadString('\n')
		ch <- strings.TrimSpace(s)
	}()
	select {
	case s := <-ch:
		return s
	case <-time.After(timeout):
		c.t.Fatalf("child printed nothing for %v", timeout)
		return ""
	}
}

func (c *child) kill() {
	if c.cmd.Process != nil && c.cmd.ProcessState == nil {
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		_ = c.cmd.Wait()
	}
}

// prefixWriter passes a child's stderr to the test log.
type prefixWriter struct {
	t      testing.TB
	prefix string
}

func (w *prefixWriter) Write(b []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if strings.Contains(l, "\"level\"") || strings.HasPrefix(l, "E") || strings.Contains(l, "child:") {
			w.t.Log(w.prefix + l)
		}
	}
	return len(b), nil
}

// runtimeProc is an NRI runtime in a child process, with its state in a file so that a new
// one after a SIGKILL replays the same pods and containers.
type runtimeProc struct {
	*child
	socket, state string
}

func startRuntimeProc(t testing.TB, socket, state string, requestTimeout time.Duration) *runtimeProc {
	t.Helper()
	c := startChild(t, "nri-runtime", "VGPU_NRI_SOCKET="+socket, "VGPU_NRI_STATE="+state, "VGPU_NRI_TIMEOUT="+requestTimeout.String())
	if got := c.line(30 * time.Second); got != "ready" {
		t.Fatalf("runtime child: %q, want ready", got)
	}
	return &runtimeProc{child: c, socket: socket, state: state}
}

func (r *runtimeProc) do(cmd runtimeCmd) runtimeAnswer {
	r.t.Helper()
	b, _ := json.Marshal(cmd)
	if _, err := r.in.Write(append(b, '\n')); err != nil {
		r.t.Fatalf("write to runtime child: %v", err)
	}
	var ans runtimeAnswer
	if err := json.Unmarshal([]byte(r.line(5*time.Minute)), &ans); err != nil {
		r.t.Fatalf("runtime child answer: %v", err)
	}
	return ans
}

// pluginChild runs the whole kubelet plugin with the Config in $VGPU_PLUGIN_CONFIG. It prints
// "started" once plugin.Start returned, then "owner" whenever it comes to own the node and
// "observer" whenever it stops owning it, and "step <name>" at each step of a handover it takes
// part in; with $VGPU_PLUGIN_CRASH_AT set it SIGKILLs itself at that step (a crash there).
func pluginChild() error {
	var cfg plugin.Config
	if err := json.Unmarshal([]byte(os.Getenv("VGPU_PLUGIN_CONFIG")), &cfg); err != nil {
		return err
	}
	gpus, err := gpu.NewSimulated("dgx-h200", 2, nodeName)
	if err != nil {
		return err
	}
	crashAt := os.Getenv("VGPU_PLUGIN_CRASH_AT")
	kube := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: nodeUID}})
	// The claims the API server knows (else the start-up reconciliation unprepares them).
	if raw := os.Getenv("VGPU_PLUGIN_CLAIMS"); raw != "" {
		var claims []resourceapi.ResourceClaim
		if err := json.Unmarshal([]byte(raw), &claims); err != nil {
			return err
		}
		for i := range claims {
			if _, err := kube.ResourceV1().ResourceClaims(claims[i].Namespace).Create(context.Background(), &claims[i], metav1.CreateOptions{}); err != nil {
				return err
			}
		}
	}
	p, err := plugin.Start(context.Background(), cfg, plugin.Deps{KubeClient: kube, GPUs: gpus, BootID: "boot-1",
		HandoverStep: func(step string) {
			fmt.Println("step " + step)
			if step == crashAt {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
		}})
	if err != nil {
		return err
	}
	fmt.Println("started")
	go func() {
		owner := false
		for {
			if now := p.Owner(); now != owner {
				owner = now
				if owner {
					fmt.Println("owner")
				} else {
					fmt.Println("observer")
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	// SIGTERM stops the plugin as the binary does (a handover in progress finishes first).
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	select {
	case <-term:
		p.Stop()
	case <-p.Done():
	}
	return nil
}

func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "vgn-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return filepath.Clean(dir)
}
