package plugin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
)

// TestCheckToolkitConfig: with env injection, a toolkit config that lets unprivileged containers
// name GPUs (the key true, or unset) gets an error line that says any pod can then ask for
// GPUs; one that forbids it, an error line that says vGPU containers get none; a missing file
// one info line; other injections read nothing.
func TestCheckToolkitConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	const key = "accept-nvidia-visible-devices-envvar-when-unprivileged"
	open := write("open.toml", "disable-require = false\n[nvidia-container-runtime]\nmode = \"legacy\"\n")
	closed := write("closed.toml", key+" = false\n")
	broken := write("broken.toml", key+" = maybe\n")
	tests := []struct {
		name      string
		injection cdi.Injection
		path      string
		want      []string // substrings of the log; nil: nothing logged
	}{
		{name: "key unset: the toolkit's default", injection: cdi.InjectionEnv, path: open,
			want: []string{"E", "honours NVIDIA_VISIBLE_DEVICES from unprivileged containers", "without a vGPU claim", key, open}},
		{name: "key false", injection: cdi.InjectionEnv, path: closed,
			want: []string{"E", "they get no GPU", "--gpu-injection=cdi"}},
		{name: "missing file", injection: cdi.InjectionEnv, path: filepath.Join(dir, "none.toml"),
			want: []string{"I", "NVIDIA Container Toolkit config not found", "none.toml"}},
		{name: "a file the toolkit would refuse", injection: cdi.InjectionEnv, path: broken,
			want: []string{"E", "not checked", "not a boolean"}},
		{name: "cdi injection: not read", injection: cdi.InjectionCDI, path: open},
		{name: "no path: not read", injection: cdi.InjectionEnv, path: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			checkToolkitConfig(logger, Config{GPUInjection: tt.injection, ToolkitConfig: tt.path})
			got := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			if tt.want == nil {
				if got != "" {
					t.Errorf("logged %q, want nothing", got)
				}
				return
			}
			if n := strings.Count(strings.TrimSpace(got), "\n"); n != 0 || !strings.HasPrefix(got, tt.want[0]) {
				t.Errorf("log %q: want one %s line", got, tt.want[0])
			}
			for _, w := range tt.want[1:] {
				if !strings.Contains(got, w) {
					t.Errorf("log %q lacks %q", got, w)
				}
			}
		})
	}
}
