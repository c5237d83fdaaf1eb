// Command registryserver runs the project's real registry server (pkg/registry) with its
// targets described by a JSON file instead of the NRI cache and the checkpoint. The
// library's test suite uses it to test libvgpu.so's registration against the real server.
//
//	registryserver --socket DIR/registry.sock --targets targets.json
//
// It prints "READY <socket>" on stdout once a connect succeeds, and exits on SIGTERM or
// SIGINT, and with --stdin-lifeline also when its stdin reaches end of file (start it with
// a pipe on stdin, and a test that dies takes it along). The targets file is read again on every lookup, so a test can
// flip "synced" or add targets by rewriting it (write a temporary file and rename it):
//
//	{
//	  "synced": true,
//	  "containers": [{"podUID": "...", "containerName": "app", "configDir": "/abs/config",
//	                  "cgroupOf": "parent"}],
//	  "claims": [{"registerUUID": "...", "claimUID": "...", "reservedFor": ["<pod UID>"],
//	              "configDir": "/abs/claim/config"}]
//	}
//
// A container's cgroup is "cgroup" (a path in the hierarchy, "/" allowed) or "cgroupOf":
// "self", "parent" (the process that started the server: its children pass the peer
// check) or a PID, resolved once: at start-up for the containers listed then, else on first
// use (a container added by a rewrite); or "initPID" to have the server derive it on
// every registration as in production. Omit all three for a created, not started container
// (RETRY). --hierarchy v1|v2 picks the cgroup hierarchy (default: as in production);
// --lock-timeout sets how long a registration waits for pids.config's lock. SIGTERM stops the
// server as the plugin's does: what it accepted is answered RETRY.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
)

type targetsFile struct {
	Synced     bool        `json:"synced"`
	Containers []container `json:"containers"`
	Claims     []claim     `json:"claims"`
}

type container struct {
	PodUID        string `json:"podUID"`
	ContainerName string `json:"containerName"`
	ConfigDir     string `json:"configDir"`
	Cgroup        string `json:"cgroup"`
	CgroupOf      string `json:"cgroupOf"`
	InitPID       int    `json:"initPID"`
}

type claim struct {
	RegisterUUID string   `json:"registerUUID"`
	ClaimUID     string   `json:"claimUID"`
	ReservedFor  []string `json:"reservedFor"`
	ConfigDir    string   `json:"configDir"`
}

// targets re-reads the file on every lookup; each cgroupOf is resolved once.
type targets struct {
	path    string
	h       registry.CgroupHierarchy
	mu      sync.Mutex        // lookups run concurrently
	cgroups map[string]string // cgroupOf → cgroup
}

func (t *targets) load() (targetsFile, error) {
	var f targetsFile
	b, err := os.ReadFile(t.path)
	if err != nil {
		return f, err
	}
	return f, json.Unmarshal(b, &f)
}

func (t *targets) resolveCgroupOf(of string) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if cg, ok := t.cgroups[of]; ok {
		return cg, nil
	}
	pid := 0
	switch of {
	case "self":
		pid = os.Getpid()
	case "parent":
		pid = os.Getppid()
	default:
		p, err := strconv.Atoi(of)
		if err != nil {
			return "", fmt.Errorf("cgroupOf %q: want self, parent or a PID", of)
		}
		pid = p
	}
	cg, err := t.h.OfPID(pid)
	if err != nil {
		return "", err
	}
	t.cgroups[of] = cg
	return cg, nil
}

func (t *targets) Synced() bool {
	f, err := t.load()
	return err == nil && f.Synced
}

func (t *targets) Container(pod, name string) (registry.Container, bool) {
	f, err := t.load()
	if err != nil {
		klog.ErrorS(err, "Read targets", "file", t.path)
		return registry.Container{}, false
	}
	for _, c := range f.Containers {
		if c.PodUID == pod && c.ContainerName == name {
			cg := c.Cgroup
			if c.CgroupOf != "" {
				// Unresolvable: no cgroup, answered as a container not started (RETRY).
				var err error
				if cg, err = t.resolveCgroupOf(c.CgroupOf); err != nil {
					klog.ErrorS(err, "Resolve cgroupOf", "file", t.path)
				}
			}
			return registry.Container{ID: pod + "/" + name, ConfigDir: c.ConfigDir, Cgroup: cg, InitPID: c.InitPID}, true
		}
	}
	return registry.Container{}, false
}

func (t *targets) ClaimByRegisterUUID(uuid string) (registry.Claim, bool) {
	f, err := t.load()
	if err != nil {
		klog.ErrorS(err, "Read targets", "file", t.path)
		return registry.Claim{}, false
	}
	for _, c := range f.Claims {
		if c.RegisterUUID == uuid {
			return registry.Claim{UID: c.ClaimUID, ReservedFor: c.ReservedFor, ConfigDir: c.ConfigDir}, true
		}
	}
	return registry.Claim{}, false
}

func main() {
	socket := flag.String("socket", "", "socket path (required)")
	targetsPath := flag.String("targets", "", "targets JSON file (required)")
	hierarchy := flag.String("hierarchy", "", "cgroup hierarchy: v1 (pids), v2 (unified), or empty as in production")
	lifeline := flag.Bool("stdin-lifeline", false, "exit when stdin reaches end of file")
	lockTimeout := flag.Duration("lock-timeout", 0, "how long a registration waits for pids.config's lock (0: the server's default)")
	klog.InitFlags(nil)
	flag.Parse()
	if err := run(*socket, *targetsPath, *hierarchy, *lifeline, registry.Config{Socket: *socket, LockTimeout: *lockTimeout}); err != nil {
		fmt.Fprintln(os.Stderr, "registryserver:", err)
		os.Exit(1)
	}
}

func run(socket, targetsPath, hierarchy string, lifeline bool, cfg registry.Config) error {
	if socket == "" || targetsPath == "" {
		return fmt.Errorf("--socket and --targets are required")
	}
	h, err := pickHierarchy(hierarchy)
	if err != nil {
		return err
	}
	t := &targets{path: targetsPath, h: h, cgroups: map[string]string{}}
	f, err := t.load()
	if err != nil {
		return fmt.Errorf("read targets %s: %w", targetsPath, err)
	}
	for _, c := range f.Containers {
		if c.CgroupOf != "" {
			if _, err := t.resolveCgroupOf(c.CgroupOf); err != nil {
				return err
			}
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	s, err := registry.Start(ctx, cfg, registry.Deps{Containers: t, Claims: t, Cgroups: &h})
	if err != nil {
		return err
	}
	defer s.Stop()
	fmt.Printf("READY %s\n", socket)
	stdinDone := make(chan struct{})
	if lifeline {
		go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stdinDone) }()
	}
	select {
	case <-ctx.Done():
	case <-stdinDone:
	}
	return nil
}

func pickHierarchy(which string) (registry.CgroupHierarchy, error) {
	switch which {
	case "":
		return registry.DetectCgroupHierarchy("/proc")
	case "v1":
		h, err := registry.DetectCgroupHierarchy("/proc")
		if err == nil && !h.V1Pids {
			err = fmt.Errorf("no cgroup v1 pids hierarchy on this host")
		}
		return h, err
	case "v2":
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			return registry.CgroupHierarchy{}, err
		}
		if mount, ok := registry.UnifiedMount(string(b)); ok {
			return registry.CgroupHierarchy{Mount: mount, Root: "/", Proc: "/proc"}, nil
		}
		return registry.CgroupHierarchy{}, fmt.Errorf("no cgroup2 mount on this host")
	default:
		return registry.CgroupHierarchy{}, fmt.Errorf("--hierarchy %q: want v1 or v2", which)
	}
}
