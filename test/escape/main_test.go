//go:build escape

// Package escape is the red-team suite (make escape): each test is one technique a tenant who
// wants more than its claim would try, run as root in a container-like sandbox against the
// shipped libvgpu.so, the fake driver, and the node's real registry server and enforcer. A
// test fails when its technique gets the tenant more device memory than its claim (beyond the
// documented per-process slack) for longer than the enforcer's bound. docs/design/threat-model.md
// holds the table of verdicts; TestEscape checks it against what the suite saw.
package escape

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

var theNode *node

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "the escape suite needs root: it builds containers out of mount namespaces and cgroups")
		return 1
	}
	build := os.Getenv("LIBRARY_BUILD")
	if build == "" {
		build = "../../_output/library"
	}
	build, err := filepath.Abs(build)
	if err == nil {
		for _, f := range []string{"libvgpu.so", "test/fake/libcuda.so.1", "test/fake/libnvidia-ml.so.1"} {
			if _, err = os.Stat(filepath.Join(build, f)); err != nil {
				err = fmt.Errorf("%w (make escape builds the library first)", err)
				break
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "escape:", err)
		return 1
	}
	// Short: the registry socket's path must stay under ~100 bytes.
	dir, err := os.MkdirTemp("/tmp", "esc-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "escape:", err)
		return 1
	}
	defer removeUnmounted(dir)
	must0(os.Chmod(dir, 0o755))
	tenantDir := filepath.Join(dir, "tenant")
	must0(os.Mkdir(tenantDir, 0o755))
	if err := buildTenants(tenantDir); err != nil {
		fmt.Fprintln(os.Stderr, "escape:", err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if theNode, err = startNode(ctx, dir, build, tenantDir); err != nil {
		fmt.Fprintln(os.Stderr, "escape: start the node:", err)
		return 1
	}
	defer theNode.stop()
	return m.Run()
}

// buildTenants compiles the tenant program, dynamically linked as every CUDA program is. (A
// static one is not in the suite: static glibc dlopens the fake driver, but the driver's libc.so.6
// beside the static libc crashes the process at its first allocation, tried 2026-12-02.)
func buildTenants(dir string) error {
	src := "tenant/tenant.c"
	for _, args := range [][]string{
		{"-O1", "-Wall", "-Werror", "-o", filepath.Join(dir, "tenant"), src, "-ldl"},
	} {
		out, err := exec.Command("gcc", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("gcc %v: %v\n%s", args, err, out)
		}
	}
	return nil
}

// removeUnmounted removes dir unless something is still mounted under it (a sandbox's mounts
// live in its own mount namespace and go with it; this is the belt to that brace).
func removeUnmounted(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil || containsMountUnder(string(b), dir) {
		fmt.Fprintf(os.Stderr, "escape: leaving %s: something is mounted under it\n", dir)
		return
	}
	_ = os.RemoveAll(dir)
}

func must0(err error) {
	if err != nil {
		panic(err)
	}
}
