//go:build benchcompare

package benchcompare

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"golang.org/x/sys/unix"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// clientLimits are both drivers' client-side rate limits (--kube-api-qps, --kube-api-burst): high
// enough that neither waits for a token. At their defaults (50 and 100, both drivers) every
// Prepare beyond the burst waits for one and both measure the limiter, not the driver: 20 ms a
// Prepare for a driver that reads one claim, 40 ms when the status write shared the limiter.
var clientLimits = []string{"--kube-api-qps", "1000", "--kube-api-burst", "2000"}

// driver is one of the two DRA drivers under comparison, as the kubelet meets it.
type driver struct {
	name      string // for the table
	driver    string // DRA driver name
	devices   []string
	shareable bool
	// start runs the driver with its state under dir and its CDI specs in cdiDir, and returns
	// the process and the kubelet's registration socket.
	start  func(b *testing.B, dir, cdiDir string) (*proc, string)
	claims []*resourceapi.ResourceClaim
}

// testDriver is Kubernetes' e2e DRA test driver (k8s.io/kubernetes/test/e2e/dra/test-driver),
// built by hack/bench-compare.sh from the Kubernetes module the cluster is built from: 8
// devices, CDI specs written without a checkpoint, the helper's default serialisation.
func testDriver(exe, kubeconfig string) *driver {
	d := &driver{name: "test driver", driver: "test-driver.cdi.k8s.io"}
	for i := range 8 {
		d.devices = append(d.devices, fmt.Sprintf("device-%02d", i))
	}
	d.start = func(b *testing.B, dir, cdiDir string) (*proc, string) {
		reg := filepath.Join(dir, "plugins_registry")
		// The driver creates neither its socket directory nor the registry directory (the
		// kubelet makes both on a node).
		mkdirs(b, reg, filepath.Join(dir, "plugins", d.driver))
		args := append([]string{"--kubeconfig", kubeconfig}, clientLimits...)
		p := startProc(b, "test-driver", exe, []string{"KUBECONFIG=" + kubeconfig},
			append(args, "kubelet-plugin", "--node-name", nodeName, "--num-devices", "8",
				"--cdi-dir", cdiDir, "--plugin-registration-path", reg, "--datadir", filepath.Join(dir, "plugins"))...)
		return p, filepath.Join(reg, d.driver+"-reg.sock")
	}
	return d
}

// ourPlugin is vgpu-kubelet-plugin as the chart runs it, with 8 simulated H200s, its state
// (checkpoint, claim directories) on this machine's disk and an NRI runtime to connect to, so
// that claims take the NRI path as on a node with containerd.
func ourPlugin(exe, kubeconfig string) *driver {
	d := &driver{name: "vgpu-dra", driver: "vgpu.dra.dev", shareable: true}
	for i := range 8 {
		d.devices = append(d.devices, fmt.Sprintf("gpu-%d", i))
	}
	d.start = func(b *testing.B, dir, cdiDir string) (*proc, string) {
		kubeletDir := filepath.Join(dir, "kubelet")
		mkdirs(b, filepath.Join(kubeletDir, "plugins_registry"))
		nriSocket := filepath.Join(dir, "nri.sock")
		startNRIRuntime(b, nriSocket)
		p := startProc(b, "vgpu-kubelet-plugin", exe, nil, append([]string{
			"--node-name", nodeName, "--kubeconfig", kubeconfig,
			"--state-dir", filepath.Join(dir, "state"), "--kubelet-dir", kubeletDir, "--cdi-dir", cdiDir,
			"--device-source", "simulated:dgx-h200:8", "--library-source=", "--gpu-cdi-kind=",
			"--nri-socket", nriSocket, "--health-port=-1", "--metrics-address=", "--debug-socket=-"}, clientLimits...)...)
		b.Cleanup(func() { unmountUnder(dir) })
		return p, filepath.Join(kubeletDir, "plugins_registry", d.driver+"-reg.sock")
	}
	return d
}

// startNRIRuntime runs containerd's side of NRI (its adaptation package) with no containers,
// for the plugin to register with.
func startNRIRuntime(b *testing.B, socket string) {
	b.Helper()
	sync := func(ctx context.Context, cb adaptation.SyncCB) error {
		_, err := cb(ctx, nil, nil)
		return err
	}
	update := func(context.Context, []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return nil, nil }
	r, err := adaptation.New("containerd", "v2.4.2", sync, update,
		adaptation.WithSocketPath(socket), adaptation.WithPluginPath(""), adaptation.WithPluginConfigPath(""))
	if err != nil {
		b.Fatal(err)
	}
	if err := r.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(r.Stop)
}

// waitSlice waits until the driver has published its ResourceSlice: it is then idle.
func waitSlice(b *testing.B, kube kubernetes.Interface, d *driver, p *proc) {
	b.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		slices, err := kube.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
		if err == nil {
			for _, s := range slices.Items {
				if s.Spec.Driver == d.driver && len(s.Spec.Devices) == len(d.devices) {
					return
				}
			}
		}
		if p.exited() || time.Now().After(deadline) {
			b.Fatalf("%s published no ResourceSlice (%v):\n%s", d.name, err, p.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func mkdirs(b *testing.B, dirs ...string) {
	b.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o750); err != nil {
			b.Fatal(err)
		}
	}
}

// mountTmpfs mounts a tmpfs on dir (as /var/run/cdi is on a node) until the benchmark ends.
func mountTmpfs(b *testing.B, dir string) {
	b.Helper()
	mkdirs(b, dir)
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64m"); err != nil {
		b.Fatalf("mount tmpfs on %s (the benchmark needs root): %v", dir, err)
	}
	b.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
}

// unmountUnder detaches every mount below dir (claims' tmpfs a stopped plugin left).
func unmountUnder(dir string) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	lines := strings.Split(string(data), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if f := strings.Fields(lines[i]); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			_ = unix.Unmount(f[4], unix.MNT_DETACH)
		}
	}
}
