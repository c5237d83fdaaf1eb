package integration

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/plugin"
)

// TestLibraryInstalledAndMounted: the plugin installs libvgpu.so and ld.so.preload into the
// state dir at start-up, and every vGPU claim's CDI spec mounts both read-only.
func TestLibraryInstalledAndMounted(t *testing.T) {
	src := filepath.Join(t.TempDir(), "libvgpu.so")
	if err := os.WriteFile(src, []byte("\x7fELF stand-in library"), 0o644); err != nil {
		t.Fatal(err)
	}
	n := newNode(t, func(c *plugin.Config) { c.LibrarySource = src })
	n.start()
	lib := filepath.Join(n.cfg.StateDir, "lib", "libvgpu.so")
	preload := filepath.Join(n.cfg.StateDir, "lib", "ld.so.preload")
	if b, err := os.ReadFile(lib); err != nil || string(b) != "\x7fELF stand-in library" {
		t.Errorf("installed library = %q, %v", b, err)
	}
	if b, err := os.ReadFile(preload); err != nil || string(b) != contract.ContainerLibraryPath+"\n" {
		t.Errorf("ld.so.preload = %q, %v; want the library's container path", b, err)
	}
	k := n.register()
	a := n.newClaim("a", allocated{request: "gpu", device: "gpu-0", memory: "1Gi", cores: 10, shareID: shareA})
	k.prepare(t, a)
	spec := n.readSpec(string(a.UID))
	mounts := spec.mounts(t, string(a.UID)+"-common")
	if mounts[contract.ContainerLibraryPath] != lib || mounts[contract.ContainerPreloadPath] != preload {
		t.Errorf("library mounts = %v", mounts)
	}
	for _, d := range spec.Devices {
		for _, m := range d.Edits.Mounts {
			if m.ContainerPath == contract.ContainerPreloadPath && !hasAll(m.Options, "ro", "nosuid", "nodev") {
				t.Errorf("ld.so.preload mount options %v, want ro,nosuid,nodev", m.Options)
			}
		}
	}

	// A new library is swapped in by rename: a container's bind mount keeps the old inode.
	before, _ := os.Stat(lib)
	if err := os.WriteFile(src, []byte("\x7fELF newer library"), 0o644); err != nil {
		t.Fatal(err)
	}
	n.restart()
	after, _ := os.Stat(lib)
	if os.SameFile(before, after) {
		t.Error("library rewritten in place; a running container's mapping would change under it")
	}
}

func hasAll(list []string, want ...string) bool {
	set := map[string]bool{}
	for _, s := range list {
		set[s] = true
	}
	for _, w := range want {
		if !set[w] {
			return false
		}
	}
	return true
}
