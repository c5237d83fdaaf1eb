package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// The runtime's own view of the containers: what containerd runs, not what the pods' status
// says. The invariant of contract §4 is checked here: no vGPU container runs without its
// per-container mounts and identity, or with another container's.

// ContainerdSocket is the local cluster's containerd socket (hack/lib/cluster.sh).
func ContainerdSocket() string {
	dir := os.Getenv("VGPU_DRA_CLUSTER_DIR")
	if dir == "" {
		dir = "/run/vgd"
	}
	return filepath.Join(dir, "containerd", "containerd.sock")
}

// Container is one container as containerd holds it: its CRI labels, and the env and mounts
// of the OCI spec it runs with (after CDI and NRI).
type Container struct {
	ID        string
	Namespace string // io.kubernetes.pod.namespace
	Pod       string // io.kubernetes.pod.name
	PodUID    string // io.kubernetes.pod.uid
	Name      string // io.kubernetes.container.name
	Env       map[string]string
	Mounts    map[string]string // destination → source
	// Repeated are the mount destinations the spec lists more than once.
	Repeated []string
}

// Runtime reads containerd's view through its own client (ctr) in the CRI namespace. A
// container's spec never changes after it is created, so each is read once and kept.
type Runtime struct {
	c     *Cluster
	mu    sync.Mutex
	specs map[string]Container
}

// Runtime returns a view of the cluster's containerd.
func (c *Cluster) Runtime() *Runtime { return &Runtime{c: c, specs: map[string]Container{}} }

// Ctr runs ctr against the cluster's containerd in the CRI namespace and returns its standard
// output (ctr logs warnings, such as cgroup v1's deprecation, on stderr).
func (r *Runtime) Ctr(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(r.c.BinDir, "ctr"), append([]string{"-a", ContainerdSocket(), "-n", "k8s.io"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Running lists the containers whose task is running. A container that goes away while it is
// being listed is left out.
func (r *Runtime) Running(ctx context.Context) ([]Container, error) {
	out, err := r.Ctr(ctx, "tasks", "ls")
	if err != nil {
		return nil, err
	}
	var running []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[2] == "RUNNING" {
			running = append(running, f[0])
		}
	}
	list := make([]Container, 0, len(running))
	seen := map[string]bool{}
	for _, id := range running {
		seen[id] = true
		c, ok, err := r.container(ctx, id)
		if err != nil {
			return nil, err
		}
		if ok {
			list = append(list, c)
		}
	}
	r.mu.Lock()
	for id := range r.specs {
		if !seen[id] {
			delete(r.specs, id)
		}
	}
	r.mu.Unlock()
	return list, nil
}

// container reads one container's labels and spec, from the cache when it was read before; ok
// is false when containerd no longer has it.
func (r *Runtime) container(ctx context.Context, id string) (Container, bool, error) {
	r.mu.Lock()
	c, ok := r.specs[id]
	r.mu.Unlock()
	if ok {
		return c, true, nil
	}
	info, err := r.Ctr(ctx, "containers", "info", id)
	if err != nil {
		return Container{}, false, nil // removed meanwhile
	}
	var raw struct {
		Labels map[string]string `json:"Labels"`
		Spec   struct {
			Process struct {
				Env []string `json:"env"`
			} `json:"process"`
			Mounts []struct {
				Destination string `json:"destination"`
				Source      string `json:"source"`
			} `json:"mounts"`
		} `json:"Spec"`
	}
	if err := json.Unmarshal([]byte(info), &raw); err != nil {
		return Container{}, false, fmt.Errorf("ctr containers info %s: %w", id, err)
	}
	c = Container{
		ID: id, Namespace: raw.Labels["io.kubernetes.pod.namespace"], Pod: raw.Labels["io.kubernetes.pod.name"],
		PodUID: raw.Labels["io.kubernetes.pod.uid"], Name: raw.Labels["io.kubernetes.container.name"],
		Env: map[string]string{}, Mounts: map[string]string{},
	}
	for _, kv := range raw.Spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		c.Env[k] = v
	}
	for _, m := range raw.Spec.Mounts {
		if _, seen := c.Mounts[m.Destination]; seen {
			c.Repeated = append(c.Repeated, m.Destination)
		}
		c.Mounts[m.Destination] = m.Source
	}
	r.mu.Lock()
	r.specs[id] = c
	r.mu.Unlock()
	return c, true, nil
}

// perContainerMounts are the three directories NRI gives a vGPU container (contract §4):
// container path → the name of the host directory in the container's directory.
var perContainerMounts = map[string]string{
	"/etc/vgpu-dra/config": "config",
	"/tmp/.vgpu_lock":      "vgpu_lock",
	"/tmp/.vmem_node":      "vmem_node",
}

// VGPUProblems returns, for every container in list that carries our claim UID (CDI gave it a
// vGPU claim on the NRI path), what breaks the invariant of contract §4: one of its three
// per-container mounts missing, or from another directory than its own
// (<stateDir>/claims/<claim UID>/<pod UID>_<name>/...) or listed twice (a container adjusted
// by two plugin instances, contract §14), its identity env missing or not its own, or a
// directory that another running container has too. Empty when all is well.
func VGPUProblems(list []Container, stateDir string) []string {
	var bad []string
	owner := map[string]Container{} // config dir → the container that has it
	for _, c := range list {
		claim := c.Env["MANAGER_VGPU_CLAIM_UID"]
		if claim == "" {
			continue
		}
		var problems []string
		own := filepath.Join(stateDir, "claims", claim, c.PodUID+"_"+c.Name)
		for _, dest := range slices.Sorted(maps.Keys(perContainerMounts)) {
			src, ok := c.Mounts[dest]
			switch {
			case !ok:
				problems = append(problems, "no mount at "+dest)
			case src != filepath.Join(own, perContainerMounts[dest]):
				problems = append(problems, fmt.Sprintf("%s from %s, not its own %s", dest, src, own))
			}
		}
		for _, dest := range c.Repeated {
			if _, ours := perContainerMounts[dest]; ours {
				problems = append(problems, dest+" mounted twice")
			}
		}
		if c.Env["VGPU_POD_UID"] != c.PodUID || c.PodUID == "" {
			problems = append(problems, fmt.Sprintf("VGPU_POD_UID=%q (pod UID %q)", c.Env["VGPU_POD_UID"], c.PodUID))
		}
		if c.Env["VGPU_CONTAINER_NAME"] != c.Name {
			problems = append(problems, fmt.Sprintf("VGPU_CONTAINER_NAME=%q", c.Env["VGPU_CONTAINER_NAME"]))
		}
		if src := c.Mounts["/etc/vgpu-dra/config"]; src != "" {
			if other, dup := owner[src]; dup {
				problems = append(problems, fmt.Sprintf("shares %s with %s", src, describe(other)))
			}
			owner[src] = c
		}
		if len(problems) > 0 {
			bad = append(bad, describe(c)+": "+strings.Join(problems, "; "))
		}
	}
	return bad
}

// Unadjusted says whether c carries our claim UID and none of what NRI gives a vGPU container:
// no per-container mount, no identity env. containerd 2.4.2 creates such a container when the
// plugin dies under its CreateContainer (contract §4, "When the plugin does not answer").
func Unadjusted(c Container) bool {
	if c.Env["MANAGER_VGPU_CLAIM_UID"] == "" || c.Env["VGPU_POD_UID"] != "" || c.Env["VGPU_CONTAINER_NAME"] != "" {
		return false
	}
	for dest := range perContainerMounts {
		if _, ok := c.Mounts[dest]; ok {
			return false
		}
	}
	return true
}

func describe(c Container) string {
	return fmt.Sprintf("%s/%s/%s (%.12s)", c.Namespace, c.Pod, c.Name, c.ID)
}
