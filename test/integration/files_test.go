package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
)

// cdiSpec is the part of a CDI spec file the tests read, decoded independently of pkg/cdi.
type cdiSpec struct {
	Version string `json:"cdiVersion"`
	Kind    string `json:"kind"`
	Devices []struct {
		Name  string `json:"name"`
		Edits struct {
			Env    []string `json:"env"`
			Mounts []struct {
				HostPath      string   `json:"hostPath"`
				ContainerPath string   `json:"containerPath"`
				Options       []string `json:"options"`
			} `json:"mounts"`
		} `json:"containerEdits"`
	} `json:"devices"`
}

func (n *node) specPath(claimUID string) string {
	return filepath.Join(n.cfg.CDIDir, driverName+"-claim_"+claimUID+".json")
}

func (n *node) readSpec(claimUID string) cdiSpec {
	n.t.Helper()
	b, err := os.ReadFile(n.specPath(claimUID))
	if err != nil {
		n.t.Fatalf("read CDI spec: %v", err)
	}
	var s cdiSpec
	if err := json.Unmarshal(b, &s); err != nil {
		n.t.Fatalf("parse CDI spec %s: %v", n.specPath(claimUID), err)
	}
	return s
}

// env returns the env of one CDI device of the spec as a map; a missing device fails the test.
func (s cdiSpec) env(t testing.TB, device string) map[string]string {
	t.Helper()
	for _, d := range s.Devices {
		if d.Name == device {
			out := map[string]string{}
			for _, kv := range d.Edits.Env {
				k, v, _ := strings.Cut(kv, "=")
				out[k] = v
			}
			return out
		}
	}
	var names []string
	for _, d := range s.Devices {
		names = append(names, d.Name)
	}
	t.Fatalf("CDI device %q not in spec; devices: %v", device, names)
	return nil
}

// mounts returns containerPath → hostPath of one CDI device.
func (s cdiSpec) mounts(t *testing.T, device string) map[string]string {
	t.Helper()
	for _, d := range s.Devices {
		if d.Name == device {
			out := map[string]string{}
			for _, m := range d.Edits.Mounts {
				out[m.ContainerPath] = m.HostPath
			}
			return out
		}
	}
	t.Fatalf("CDI device %q not in spec", device)
	return nil
}

func (n *node) readCheckpoint() checkpoint.Data {
	n.t.Helper()
	var env struct {
		Version string          `json:"version"`
		Data    checkpoint.Data `json:"data"`
	}
	b, err := os.ReadFile(filepath.Join(n.cfg.KubeletDir, "plugins", driverName, "checkpoint.json"))
	if err != nil {
		n.t.Fatalf("read checkpoint: %v", err)
	}
	if err := json.Unmarshal(b, &env); err != nil {
		n.t.Fatalf("parse checkpoint: %v", err)
	}
	if env.Version != checkpoint.VersionV1 && env.Version != checkpoint.VersionV2 {
		n.t.Fatalf("checkpoint version %q, want v1 or v2", env.Version)
	}
	return env.Data
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func (n *node) claimDir(uid string) string { return filepath.Join(n.cfg.StateDir, "claims", uid) }
