package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain lets the test binary act as the plugin: with VGPU_PLUGIN_AS_MAIN set it runs main().
func TestMain(m *testing.M) {
	if os.Getenv("VGPU_PLUGIN_AS_MAIN") != "" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type process struct {
	cmd   *exec.Cmd
	lines chan string
}

func startPlugin(t *testing.T, args ...string) *process {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "VGPU_PLUGIN_AS_MAIN=1")
	out, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = cmd.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, lines: make(chan string, 1000)}
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			select {
			case p.lines <- s.Text():
			default:
			}
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return p
}

// waitFor returns the first log line containing s, failing the test after a generous deadline.
func (p *process) waitFor(t *testing.T, s string) string {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				t.Fatalf("plugin exited before logging %q", s)
			}
			if strings.Contains(line, s) {
				return line
			}
		case <-deadline:
			t.Fatalf("plugin did not log %q", s)
		}
	}
}

// TestSecondInstanceWaitsAndSIGTERMStopsCleanly runs the real binary twice on one node: the
// second waits on the instance lock, saying why, and takes over when the first is stopped with
// SIGTERM, which it handles gracefully (exit 0).
func TestSecondInstanceWaitsAndSIGTERMStopsCleanly(t *testing.T) {
	root, err := os.MkdirTemp("/tmp", "vgc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	// Nothing of the kubelet's directories exists: the plugin creates what it needs.
	kubelet := filepath.Join(root, "kubelet")
	// The API server is never reached in this test; the plugin only needs a client config.
	kubeconfig := filepath.Join(root, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--node-name=node-1", "--kubeconfig=" + kubeconfig, "--device-source=simulated:dgx-a100:1",
		"--kubelet-dir=" + kubelet, "--state-dir=" + filepath.Join(root, "state"), "--cdi-dir=" + filepath.Join(root, "cdi"),
		"--gpu-cdi-kind=", "--gpu-injection=none", "--health-port=-1", "--metrics-address=", "--library-source="}

	first := startPlugin(t, args...)
	first.waitFor(t, "Kubelet plugin started")
	second := startPlugin(t, args...)
	line := second.waitFor(t, "Another plugin instance holds the instance lock")
	if !strings.Contains(line, fmt.Sprint(first.cmd.Process.Pid)) {
		t.Errorf("waiting message does not name the holder's PID %d: %s", first.cmd.Process.Pid, line)
	}
	if err := first.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	first.waitFor(t, "Shutting down")
	for range first.lines {
	}
	if err := first.cmd.Wait(); err != nil {
		t.Errorf("first instance after SIGTERM: %v, want exit 0", err)
	}
	second.waitFor(t, "Took over the instance lock")
	second.waitFor(t, "Kubelet plugin started")
}

// TestFlagErrors: misconfiguration is refused before anything starts, with a clear message.
func TestFlagErrors(t *testing.T) {
	for args, want := range map[string]string{
		"--feature-gates=VGPUSupport=false":         "depends on features that are disabled: [VGPUSupport]",
		"--node-name=n --memory-reserve=lots":       "--memory-reserve",
		"--node-name=n --gpu-injection=magic":       "--gpu-injection",
		"":                                          "--node-name",
		"--node-name=n --kubelet-dir=relative/path": "absolute",
		"--node-name=n --kubelet-dir=/" + strings.Repeat("x", 90): "unix sockets need under 100",
		"--node-name=n --core-enforcement=freeze":                 `--core-enforcement: "freeze": want report, throttle or off`,
		"--node-name=n --core-enforce-margin=0":                   "--core-enforce-margin 0: want 1-100",
		"--node-name=n --core-enforce-margin=101":                 "--core-enforce-margin 101: want 1-100",
		"--node-name=n --core-enforce-window=-1s":                 "--core-enforce-window must not be negative",
		"--node-name=n --core-period=-1s":                         "--core-period must not be negative",
	} {
		cmd := exec.Command(os.Args[0], strings.Fields(args)...)
		cmd.Env = append(os.Environ(), "VGPU_PLUGIN_AS_MAIN=1", "NODE_NAME=")
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("args %q: err %v, output %q; want a failure mentioning %q", args, err, out, want)
		}
	}
}
