package main

import (
	"bufio"
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

// TestStartAndSIGTERM runs the real binary on a node without a kubelet: it serves its socket
// and writes the shares' CDI spec, waits for kubelet.sock, and on SIGTERM stops cleanly (exit
// 0), taking its socket with it.
func TestStartAndSIGTERM(t *testing.T) {
	root, err := os.MkdirTemp("/tmp", "vgp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
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
	kubelet := filepath.Join(root, "k")
	cmd := exec.Command(os.Args[0], "--node-name=node-1", "--kubeconfig="+kubeconfig, "--device-source=simulated:dgx-a100:2",
		"--kubelet-dir="+kubelet, "--state-dir="+filepath.Join(root, "s"), "--cdi-dir="+filepath.Join(root, "c"),
		"--gpu-cdi-kind=", "--gpu-injection=none", "--health-port=-1", "--metrics-address=", "--library-source=",
		"--shares-per-gpu=2", "--claim-fs-size=0")
	cmd.Env = append(os.Environ(), "VGPU_PLUGIN_AS_MAIN=1")
	out, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 1000)
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			lines <- s.Text()
		}
		close(lines)
	}()
	waitFor := func(s string) {
		t.Helper()
		deadline := time.After(60 * time.Second)
		for {
			select {
			case line, ok := <-lines:
				if !ok {
					t.Fatalf("plugin exited before logging %q", s)
				}
				if strings.Contains(line, s) {
					return
				}
			case <-deadline:
				t.Fatalf("plugin did not log %q", s)
			}
		}
	}
	waitFor("Device plugin started")
	sock := filepath.Join(kubelet, "device-plugins", "vgpu.dra.dev-vgpu.sock")
	if _, err := os.Stat(sock); err != nil {
		t.Errorf("plugin socket: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "c", "vgpu.dra.dev-share.json")); err != nil {
		t.Errorf("shares' CDI spec: %v", err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor("Shutting down")
	for range lines {
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("after SIGTERM: %v, want exit 0", err)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("the plugin socket is left after SIGTERM: %v", err)
	}
}

// TestFlagErrors: misconfiguration is refused before anything starts, with a clear message.
func TestFlagErrors(t *testing.T) {
	for args, want := range map[string]string{
		"": "--node-name",
		"--node-name=n --feature-gates=VGPUSupport=false,NRISupport=false": "VGPUSupport must be on",
		"--node-name=n --share-memory=lots":                                "--share-memory",
		"--node-name=n --allocation-policy=random":                         "--allocation-policy",
		"--node-name=n --resource-name=vgpu":                               "--resource-name",
		"--node-name=n --shares-per-gpu=0":                                 "--shares-per-gpu",
		"--node-name=n --enforce-slack-per-process=much":                   "--enforce-slack-per-process",
		"--node-name=n --enforce-grace=-1s":                                "--enforce-grace",
		"--node-name=n --foreign-gpu-process=ignore":                       `--foreign-gpu-process: "ignore": want report or kill`,
		"--node-name=n --core-enforcement=freeze":                          `--core-enforcement: "freeze": want report, throttle or off`,
		"--node-name=n --core-enforce-margin=0":                            "--core-enforce-margin 0: want 1-100",
		"--node-name=n --core-enforce-window=-1s":                          "--core-enforce-window must not be negative",
		"--node-name=n --core-period=-1s":                                  "--core-period must not be negative",
	} {
		cmd := exec.Command(os.Args[0], strings.Fields(args)...)
		cmd.Env = append(os.Environ(), "VGPU_PLUGIN_AS_MAIN=1", "NODE_NAME=")
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("args %q: err %v, output %q; want a failure mentioning %q", args, err, out, want)
		}
	}
}
