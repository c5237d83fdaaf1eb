//go:build escape

package escape

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// The capabilities a container runtime gives a container by default (containerd's and
// Docker's set): the tenant is root with these, and without CAP_SYS_ADMIN it cannot mount,
// unmount or enter another mount namespace.
const containerCaps = "-all,+chown,+dac_override,+fsetid,+fowner,+mknod,+net_raw,+setgid,+setuid,+setfcap,+setpcap,+net_bind_service,+sys_chroot,+kill,+audit_write"

// sandbox is one tenant container, laid out as the contract's §3–§4 say a vGPU container is:
// its own writable root file system (or a read-only one, as the webhook's
// require-readonly-root policy demands), the library and /etc/ld.so.preload bind-mounted
// read-only from the node, the config directory read-only, the registry directory read-only,
// /tmp/.vgpu_lock and /tmp/.vmem_node writable. It runs in a mount namespace of its own, in a
// cgroup of its own, as root with a container's default capabilities.
type sandbox struct {
	name   string
	dir    string // host directory: root/ and state/
	cgroup string // in the registry's hierarchy
	podUID string
	limit  uint64
	// readOnlyRoot mounts the root file system read-only (a writable tmpfs on /tmp).
	readOnlyRoot bool
}

func (s *sandbox) root() string      { return filepath.Join(s.dir, "root") }
func (s *sandbox) state() string     { return filepath.Join(s.dir, "state") }
func (s *sandbox) configDir() string { return filepath.Join(s.state(), "config") }

// newSandbox lays out a container's root file system and its node-side state.
func newSandbox(t *testing.T, n *node, name string, limitMiB uint64, readOnlyRoot bool) *sandbox {
	t.Helper()
	s := &sandbox{name: name, dir: filepath.Join(n.dir, name), podUID: uidOf("pod/" + name), limit: limitMiB << 20, readOnlyRoot: readOnlyRoot}
	root, state := s.root(), s.state()
	// Registered first, so run last: after the cgroup is empty. The sandbox's mounts went with
	// its mount namespace; removeUnmounted checks that before it removes anything.
	t.Cleanup(func() { removeUnmounted(s.dir) })
	for _, d := range []string{"usr", "etc/vgpu-dra/lib", "etc/vgpu-dra/config", "etc/vgpu-dra/registry", "tmp", "proc", "dev",
		"opt/tenant", "opt/volume", "run/fakegpu", "tmp/.vgpu_lock", "tmp/.vmem_node", strings.TrimPrefix(n.build, "/")} {
		must(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	must(t, os.Chmod(filepath.Join(root, "tmp"), 0o1777))
	for _, l := range []string{"bin", "sbin", "lib", "lib64"} {
		must(t, os.Symlink("usr/"+l, filepath.Join(root, l)))
	}
	for _, f := range []string{"etc/passwd", "etc/group"} {
		b, err := os.ReadFile("/" + f)
		must(t, err)
		must(t, os.WriteFile(filepath.Join(root, f), b, 0o644))
	}
	for _, f := range []string{"etc/vgpu-dra/lib/libvgpu.so", "etc/ld.so.preload"} {
		must(t, os.WriteFile(filepath.Join(root, f), nil, 0o644)) // mount points
	}
	for _, d := range []string{"config", "vgpu_lock", "vmem_node", "volume"} {
		must(t, os.MkdirAll(filepath.Join(state, d), 0o777))
	}
	must(t, os.Chmod(filepath.Join(state, "vgpu_lock"), 0o777))
	must(t, os.Chmod(filepath.Join(state, "vmem_node"), 0o777))
	cfg := contract.ContainerConfig{ClaimUID: uidOf("claim/" + name), PodUID: s.podUID, ContainerName: "app",
		GPUs: []contract.ContainerGPU{{Index: 0, UUID: gpuUUID, MemoryBytes: int64(s.limit), Cores: 0}}}
	must(t, cfg.Validate())
	must(t, os.WriteFile(filepath.Join(s.configDir(), contract.ContainerConfigName), cfg.Encode(), 0o644))
	must(t, os.WriteFile(filepath.Join(s.configDir(), contract.PIDsConfigName), nil, 0o644))
	// A read-only volume of the tenant's own (a ConfigMap's kind) at /opt/volume: its forged
	// configuration, the container's identity without limits.
	forged := cfg
	forged.GPUs = []contract.ContainerGPU{{Index: 0, UUID: gpuUUID}}
	must(t, os.WriteFile(filepath.Join(state, "volume", contract.ContainerConfigName), forged.Encode(), 0o644))
	s.cgroup = n.newCgroup(t, name)
	n.add(s)
	return s
}

// run runs script with /bin/sh in the sandbox and returns what it printed (stdout and stderr
// together) once it exits, or fails the test after timeout.
func (s *sandbox) run(t *testing.T, n *node, script string, timeout time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	rootOpt := "rw"
	if s.readOnlyRoot {
		rootOpt = "ro"
	}
	// The mounts are made in the new mount namespace only (private propagation): the host
	// sees none of them, and they go with the namespace's last process.
	inner := `set -e
R="$ROOT"
bindro() { mount --bind "$1" "$2"; mount -o remount,bind,ro,nosuid,nodev "$2"; }
bindrw() { mount --bind "$1" "$2"; mount -o remount,bind,rw,nosuid,nodev "$2"; }
mount --bind "$R" "$R"
# A read-only root gets its writable /tmp first: a checkout under /tmp has the build directory
# (the fake driver) under it, whose mount must go on top of the tmpfs, not under it.
if [ "$ROOTOPT" = ro ]; then mount -o remount,bind,ro "$R"; mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"; mkdir -p "$R/tmp/.vgpu_lock" "$R/tmp/.vmem_node"; fi
mkdir -p "$R$BUILD"
bindro /usr "$R/usr"
bindro "$BUILD" "$R$BUILD"
bindro "$TENANT" "$R/opt/tenant"
bindro "$STATE/volume" "$R/opt/volume"
mount --rbind /dev "$R/dev"
mount -t proc proc "$R/proc"
bindrw "$STATE/vgpu_lock" "$R/tmp/.vgpu_lock"
bindrw "$STATE/vmem_node" "$R/tmp/.vmem_node"
bindro "$LIB" "$R/etc/vgpu-dra/lib/libvgpu.so"
bindro "$PRELOAD" "$R/etc/ld.so.preload"
bindro "$STATE/config" "$R/etc/vgpu-dra/config"
bindro "$REGISTRY" "$R/etc/vgpu-dra/registry"
bindrw "$GPUDIR" "$R/run/fakegpu"
cd "$R"
exec chroot "$R" /usr/bin/setpriv --bounding-set "$CAPS" --inh-caps -all -- /usr/bin/env -i \
  PATH=/usr/local/bin:/usr/bin:/bin:/opt/tenant HOME=/root LD_LIBRARY_PATH="$FAKE" \
  FAKE_GPU_STATE=/run/fakegpu/gpu.state FAKE_GPU_DEVICES="$DEVICES" \
  MANAGER_VGPU_CLAIM_UID="$CLAIM" /bin/sh -c "$SCRIPT"
`
	outer := `echo $$ > "$CGPROCS" && exec unshare --mount --propagation private -- /bin/bash -c "$INNER"`
	cmd := exec.CommandContext(ctx, "/bin/bash", "-c", outer)
	cmd.Dir = "/"
	cmd.Env = []string{
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
		"ROOT=" + s.root(), "STATE=" + s.state(), "BUILD=" + n.build, "TENANT=" + n.tenantDir,
		"LIB=" + n.libvgpu, "PRELOAD=" + n.preloadFile, "REGISTRY=" + n.registryDir, "GPUDIR=" + n.gpuDir,
		"FAKE=" + n.fakeDir, "DEVICES=" + gpuUUID + ":16384", "CLAIM=" + uidOf("claim/"+s.name), "CAPS=" + containerCaps,
		"ROOTOPT=" + rootOpt, "CGPROCS=" + n.cgroupProcs(s.cgroup), "INNER=" + inner, "SCRIPT=" + script,
	}
	// Its own process group: a timeout kills every process of the technique.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s: the technique did not end within %v:\n%s", s.name, timeout, out.String())
	}
	if err != nil {
		out.WriteString(fmt.Sprintf("\n[sandbox exit: %v]\n", err))
	}
	return out.String()
}

// uidOf is a stable UID for a name, in the form Kubernetes gives UIDs.
func uidOf(name string) string {
	h := sha256.Sum256([]byte(name))
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
