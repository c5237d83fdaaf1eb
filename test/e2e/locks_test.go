//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The cluster scripts' two locks (hack/lib/cluster.sh): the suite lock, held by the one make
// e2e, make chaos or make demo that runs, and the cluster lock, held by one cluster script at a
// time. A daemon that inherited either descriptor would hold it for as long as the cluster runs:
// after make demo, which leaves its cluster up, every later suite would wait forever.
const clusterLock = "/run/lock/vgd-cluster.lock"

func TestClusterDaemonsHoldNoLock(t *testing.T) {
	bins, err := filepath.Glob(filepath.Join(binDir, "*"))
	if err != nil || len(bins) == 0 {
		t.Fatalf("cluster binaries in %s: %v %v", binDir, bins, err)
	}
	// _output/cluster/bin links into the machine's cache: <cache>/bin/<component>-<version>-<recipe>/<binary>.
	exes := map[string]bool{}
	var cache string
	for _, b := range bins {
		if real, err := filepath.EvalSymlinks(b); err == nil {
			exes[real] = true
			cache = filepath.Dir(filepath.Dir(filepath.Dir(real)))
		}
	}
	locks := map[string]bool{filepath.Join(cache, "suite.lock"): true, clusterLock: true}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	daemons := 0
	for _, p := range procs {
		exe, err := os.Readlink(filepath.Join(p, "exe"))
		if err != nil || !exes[exe] {
			continue
		}
		daemons++
		fds, _ := filepath.Glob(filepath.Join(p, "fd", "*"))
		for _, fd := range fds {
			if target, err := os.Readlink(fd); err == nil && locks[target] {
				t.Errorf("%s (%s) holds %s as fd %s: it keeps the lock while the cluster runs", filepath.Base(exe), p, target, filepath.Base(fd))
			}
		}
	}
	// etcd, the control plane, containerd and its shims, the kubelet, kube-proxy.
	if daemons < 7 {
		t.Errorf("found %d processes of the cluster's binaries (%s), want every daemon of the running cluster", daemons, strings.Join(keys(exes), " "))
	}
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
