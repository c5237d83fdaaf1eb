package deviceplugin

import (
	"strings"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
)

func validConfig() Config {
	return Config{
		NodeName: "node-1", DriverName: "vgpu.dra.dev", ResourceName: resource,
		StateDir: "/var/lib/vgpu-dra", KubeletDir: "/var/lib/kubelet", CDIDir: "/var/run/cdi",
		Sizing: Sizing{SharesPerGPU: 4}, Policy: PolicyBinpack, GPUInjection: cdi.InjectionCDI,
	}
}

func TestConfigPaths(t *testing.T) {
	c := validConfig()
	for got, want := range map[string]string{
		c.Socket():             "/var/lib/kubelet/device-plugins/vgpu.dra.dev-vgpu.sock",
		c.KubeletSocket():      "/var/lib/kubelet/device-plugins/kubelet.sock",
		c.PodResourcesSocket(): "/var/lib/kubelet/pod-resources/kubelet.sock",
		c.InstanceLockPath():   "/var/lib/kubelet/plugins/vgpu.dra.dev/instance.lock",
		c.DebugSocketPath():    "/var/lib/vgpu-dra/device-plugin-debug.sock",
	} {
		if got != want {
			t.Errorf("%s, want %s", got, want)
		}
	}
}

// TestConfigValidate: every problem is reported at once, each naming its flag.
func TestConfigValidate(t *testing.T) {
	if err := validConfig().Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	tests := []struct {
		name   string
		mutate func(*Config)
		want   []string
	}{
		{"resource without domain", func(c *Config) { c.ResourceName = "vgpu" }, []string{"--resource-name"}},
		{"kubernetes.io resource", func(c *Config) { c.ResourceName = "kubernetes.io/vgpu" }, []string{"--resource-name"}},
		{"resource too long for labels", func(c *Config) { c.ResourceName = "example.com/" + strings.Repeat("g", 55) }, []string{"--resource-name"}},
		{"several at once", func(c *Config) {
			c.NodeName, c.Sizing.SharesPerGPU, c.Policy, c.Sizing.ShareCores = "", 0, "random", 200
		}, []string{"--node-name", "--shares-per-gpu", "--allocation-policy", "--share-cores"}},
		{"relative dirs", func(c *Config) { c.StateDir = "state" }, []string{"--state-dir"}},
		{"long socket path", func(c *Config) { c.KubeletDir = "/" + strings.Repeat("k", 90) }, []string{"under 100"}},
		{"injection", func(c *Config) { c.GPUInjection = "magic" }, []string{"--gpu-injection"}},
		{"negative enforce timings", func(c *Config) { c.Enforcement.Grace = -1 }, []string{"--enforce-grace"}},
		{"enforce policies", func(c *Config) {
			c.Enforcement.Foreign, c.Enforcement.Cores, c.Enforcement.CoreMargin = "ignore", "freeze", 101
		}, []string{`--foreign-gpu-process: "ignore"`, `--core-enforcement: "freeze"`, "--core-enforce-margin"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.mutate(&c)
			err := c.Validate()
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %s", err, w)
				}
			}
		})
	}
}
