//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The runtime's own view of the containers: what containerd will run, not what the pods'
// status says. An invariant about vGPU containers is checked here (contract §4: no vGPU
// container runs without its per-container mounts and identity).

// containerdSocket is the local cluster's containerd socket (hack/lib/cluster.sh).
func containerdSocket() string {
	dir := os.Getenv("VGPU_DRA_CLUSTER_DIR")
	if dir == "" {
		dir = "/run/vgd"
	}
	return filepath.Join(dir, "containerd", "containerd.sock")
}

// ctr runs containerd's client against the cluster's containerd, in the CRI namespace, and
// returns its standard output (ctr logs warnings, such as cgroup v1's deprecation, on stderr).
func ctr(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "ctr"), append([]string{"-a", containerdSocket(), "-n", "k8s.io"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%w: %s", err, stderr.String())
	}
	return stdout.String(), nil
}

// runtimeContainer is one container as containerd holds it.
type runtimeContainer struct {
	ID     string
	Pod    string // io.kubernetes.pod.name label
	Name   string // io.kubernetes.container.name label
	Env    map[string]string
	Mounts map[string]string // destination → source
	// Repeated are the mount destinations the spec lists more than once.
	Repeated []string
}

// runningContainers lists the containers whose task is running, with their OCI spec's env and
// mounts. A container that goes away while it is being listed is skipped.
func runningContainers() ([]runtimeContainer, error) {
	out, err := ctr("tasks", "ls")
	if err != nil {
		return nil, fmt.Errorf("ctr tasks ls: %v: %s", err, out)
	}
	var running []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[2] == "RUNNING" {
			running = append(running, f[0])
		}
	}
	var list []runtimeContainer
	for _, id := range running {
		info, err := ctr("containers", "info", id)
		if err != nil {
			continue // removed meanwhile
		}
		var c struct {
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
		if err := json.Unmarshal([]byte(info), &c); err != nil {
			return nil, fmt.Errorf("ctr containers info %s: %v", id, err)
		}
		rc := runtimeContainer{ID: id, Pod: c.Labels["io.kubernetes.pod.name"], Name: c.Labels["io.kubernetes.container.name"],
			Env: map[string]string{}, Mounts: map[string]string{}}
		for _, kv := range c.Spec.Process.Env {
			k, v, _ := strings.Cut(kv, "=")
			rc.Env[k] = v
		}
		for _, m := range c.Spec.Mounts {
			if _, seen := rc.Mounts[m.Destination]; seen {
				rc.Repeated = append(rc.Repeated, m.Destination)
			}
			rc.Mounts[m.Destination] = m.Source
		}
		list = append(list, rc)
	}
	return list, nil
}

// unadjustedVGPUContainers returns, for every running container that carries our claim UID
// (so CDI gave it a vGPU claim on the NRI path), what it lacks of what NRI must give it: the
// three per-container mounts and its identity. Empty when every one is complete.
func unadjustedVGPUContainers(list []runtimeContainer) []string {
	var bad []string
	for _, c := range list {
		if c.Env["MANAGER_VGPU_CLAIM_UID"] == "" {
			continue
		}
		var missing []string
		for _, dest := range []string{"/etc/vgpu-dra/config", "/tmp/.vgpu_lock", "/tmp/.vmem_node"} {
			if _, ok := c.Mounts[dest]; !ok {
				missing = append(missing, dest)
			}
		}
		if c.Env["VGPU_POD_UID"] == "" || c.Env["VGPU_CONTAINER_NAME"] != c.Name {
			missing = append(missing, "identity env")
		}
		if len(missing) > 0 {
			slices.Sort(missing)
			bad = append(bad, fmt.Sprintf("%s/%s (%s) lacks %s", c.Pod, c.Name, c.ID[:12], strings.Join(missing, ", ")))
		}
	}
	return bad
}

// duplicateVGPUMounts returns, for every running vGPU container, the vGPU mount destinations its
// spec has more than once: a container adjusted by two plugin instances (contract §14).
func duplicateVGPUMounts(list []runtimeContainer) []string {
	var bad []string
	for _, c := range list {
		if c.Env["MANAGER_VGPU_CLAIM_UID"] == "" {
			continue
		}
		for _, dest := range c.Repeated {
			if strings.HasPrefix(dest, "/etc/vgpu-dra/") || strings.HasPrefix(dest, "/tmp/.v") {
				bad = append(bad, fmt.Sprintf("%s/%s (%s) has %s twice", c.Pod, c.Name, c.ID[:12], dest))
			}
		}
	}
	return bad
}
