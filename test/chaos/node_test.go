//go:build chaos

package chaos

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/test/cluster"
)

// Host paths the plugin writes with the chart's defaults (contract §1, §3, §4).
var (
	cdiSpecGlob = "/var/run/cdi/" + cluster.DriverName + "-claim_*.json"
	claimsRoot  = filepath.Join(cluster.StateDir, "claims")
)

// nodeState is what the node holds about prepared claims at one moment.
type nodeState struct {
	plugin  checkpoint.Data
	kubelet map[string]cluster.KubeletClaim
	specs   map[string]bool     // claim UIDs with a CDI spec
	dirs    map[string]claimDir // claim UID → its directory under <state>/claims
}

// claimDir is one claim's directory: whether its own tmpfs is mounted there, and the
// per-container directories (<pod UID>_<container name>) in it.
type claimDir struct {
	mounted    bool
	containers []string
}

// readNode reads the plugin's checkpoint, the kubelet's DRA state and the plugin's files. A
// checkpoint that does not parse is an error: both files are only ever replaced whole.
func readNode() (nodeState, error) {
	var st nodeState
	var err error
	if st.plugin, err = checkpoint.ReadFile(cluster.PluginCheckpoint); err != nil {
		return st, fmt.Errorf("the plugin's checkpoint: %w", err)
	}
	if st.kubelet, err = cluster.ReadKubeletDRAState(cluster.KubeletDRAState); err != nil {
		return st, err
	}
	specs, err := filepath.Glob(cdiSpecGlob)
	if err != nil {
		return st, fmt.Errorf("list CDI specs: %w", err)
	}
	st.specs = map[string]bool{}
	for _, p := range specs {
		st.specs[strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), cluster.DriverName+"-claim_"), ".json")] = true
	}
	st.dirs, err = readClaimDirs()
	return st, err
}

func readClaimDirs() (map[string]claimDir, error) {
	dirs := map[string]claimDir{}
	var root syscall.Stat_t
	if err := syscall.Stat(claimsRoot, &root); errors.Is(err, fs.ErrNotExist) {
		return dirs, nil
	} else if err != nil {
		return nil, fmt.Errorf("inspect %s: %w", claimsRoot, err)
	}
	entries, err := os.ReadDir(claimsRoot)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", claimsRoot, err)
	}
	for _, e := range entries {
		var st syscall.Stat_t
		path := filepath.Join(claimsRoot, e.Name())
		if err := syscall.Stat(path, &st); err != nil {
			continue // removed meanwhile
		}
		d := claimDir{mounted: st.Dev != root.Dev}
		inner, _ := os.ReadDir(path)
		for _, ie := range inner {
			if strings.Contains(ie.Name(), "_") {
				d.containers = append(d.containers, ie.Name())
			}
		}
		dirs[e.Name()] = d
	}
	return dirs, nil
}

// nodeProblems lists what is wrong with st, given the pods that exist (UID → container names):
// disagreements between the checkpoint and the kubelet, a completed claim without its CDI spec
// or its mounted tmpfs, a CDI spec or claim directory without a claim, a per-container
// directory without its pod, the GPU's memory taken past its capacity.
func (s *suite) nodeProblems(st nodeState, pods map[string][]string) []string {
	problems := cluster.Disagreements(st.plugin, st.kubelet)
	var taken int64
	for _, uid := range slices.Sorted(maps.Keys(st.plugin.Claims)) {
		pc := st.plugin.Claims[uid]
		for _, d := range pc.Devices {
			taken += memoryOf(d.MemoryBytes, s.gpuMemory)
		}
		if pc.State != checkpoint.PrepareCompleted {
			continue
		}
		if !st.specs[uid] {
			problems = append(problems, fmt.Sprintf("completed claim %s/%s (%s) has no CDI spec", pc.Namespace, pc.Name, uid))
		}
		if d, ok := st.dirs[uid]; !ok || !d.mounted {
			problems = append(problems, fmt.Sprintf("completed claim %s/%s (%s) has no directory on its own tmpfs (directory: %v)", pc.Namespace, pc.Name, uid, ok))
		}
	}
	if taken > s.gpuMemory {
		problems = append(problems, fmt.Sprintf("the checkpoint's claims take %d bytes of a GPU of %d", taken, s.gpuMemory))
	}
	for _, uid := range slices.Sorted(maps.Keys(st.specs)) {
		if _, ok := st.plugin.Claims[uid]; !ok {
			problems = append(problems, "orphan CDI spec of claim "+uid)
		}
	}
	for _, uid := range slices.Sorted(maps.Keys(st.dirs)) {
		if _, ok := st.plugin.Claims[uid]; !ok {
			problems = append(problems, "orphan claim directory "+uid)
		}
		for _, cd := range st.dirs[uid].containers {
			podUID, name, _ := strings.Cut(cd, "_")
			if !slices.Contains(pods[podUID], name) {
				problems = append(problems, fmt.Sprintf("orphan per-container directory %s/%s (no such pod or container)", uid, cd))
			}
		}
	}
	return problems
}

// memoryOf is the memory a result takes: its consumed bytes, 0 meaning the whole GPU.
func memoryOf(v, whole int64) int64 {
	if v == 0 {
		return whole // 0 = the whole GPU (contract §7)
	}
	return v
}

// livePods maps the UID of every pod of the suite's namespace to its containers' names.
func livePods(ctx context.Context) (map[string][]string, error) {
	list, err := c.Kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	out := map[string][]string{}
	for _, p := range list.Items {
		for _, ctr := range p.Spec.Containers {
			out[string(p.UID)] = append(out[string(p.UID)], ctr.Name)
		}
	}
	return out, nil
}

// settle checks that the node agrees with itself: it polls until a reading shows no problem
// (the churn goes on, and a Prepare or an Unprepare in flight looks like one for a moment) and
// records every problem that lasts timeout as a violation.
func (s *suite) settle(r *run, what string, timeout time.Duration) {
	ctx := context.Background()
	var problems []string
	start := time.Now()
	defer func() { r.sample("node settled", time.Since(start)) }()
	err := cluster.Poll(ctx, timeout, func() (bool, error) {
		// Pods first: a per-container directory made after this list has a pod in it.
		pods, err := livePods(ctx)
		if err != nil {
			return false, err
		}
		st, err := readNode()
		if err != nil {
			problems = []string{err.Error()}
			return false, err
		}
		problems = s.nodeProblems(st, pods)
		return len(problems) == 0, nil
	})
	r.check(7) // agreement, lost, duplicated, specs, directories, per-container directories, capacity
	if err != nil {
		for _, p := range problems {
			r.violate("the node does not settle: "+p, fmt.Sprintf("%s, for %v", what, timeout))
		}
		if len(problems) == 0 {
			r.violate("the node cannot be read", fmt.Sprintf("%s: %v", what, err))
		}
	}
}

// drain deletes what the run's jobs left (each job deletes its own; a failed one may not have),
// waits until the API server has no pod or claim left in the namespace, and then until the node
// holds nothing of any claim: every claim unprepared, every file gone.
func (s *suite) drain(r *run) {
	ctx := context.Background()
	err := retry(ctx, apiBound, func(ctx context.Context) error {
		if err := c.Kube.CoreV1().Pods(namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			return err
		}
		return c.Kube.ResourceV1().ResourceClaims(namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	})
	if err != nil {
		r.violate("leftovers not deleted", err.Error())
	}
	err = cluster.Poll(ctx, runBound, func() (bool, error) {
		pods, err := c.Kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		claims, err := c.Kube.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return len(pods.Items)+len(claims.Items) == 0, fmt.Errorf("%d pods and %d claims left", len(pods.Items), len(claims.Items))
	})
	if err != nil {
		r.violate("the churn does not drain", err.Error())
	}
	var left []string
	err = cluster.Poll(ctx, 2*time.Minute, func() (bool, error) {
		st, err := readNode()
		if err != nil {
			left = []string{err.Error()}
			return false, err
		}
		left = nil
		for uid, pc := range st.plugin.Claims {
			left = append(left, fmt.Sprintf("claim %s/%s (%s) %s in the plugin's checkpoint", pc.Namespace, pc.Name, uid, pc.State))
		}
		for uid, kc := range st.kubelet {
			left = append(left, fmt.Sprintf("claim %s/%s (%s) in the kubelet's DRA state", kc.Namespace, kc.Name, uid))
		}
		for uid := range st.specs {
			left = append(left, "CDI spec of claim "+uid)
		}
		for uid, d := range st.dirs {
			left = append(left, fmt.Sprintf("claim directory %s (tmpfs mounted: %v, container directories %v)", uid, d.mounted, d.containers))
		}
		temps, err := staleTemporaries()
		left = append(left, temps...)
		return len(left) == 0, err
	})
	r.check(5) // checkpoint, kubelet state, CDI specs, directories, temporary files
	if err != nil {
		slices.Sort(left)
		for _, l := range left {
			r.violate("left after the churn drained: "+l, err.Error())
		}
	}
}

// temporaryGlobs match the temporary files the plugin writes its files through (a CDI spec, the
// checkpoint, the registry socket's staged name): a process killed between creating and renaming
// one leaves it, and the next instance must clean it up.
var temporaryGlobs = []string{
	"/var/run/cdi/." + cluster.DriverName + "-claim_*.tmp",
	filepath.Join(filepath.Dir(cluster.PluginCheckpoint), "."+filepath.Base(cluster.PluginCheckpoint)+".tmp-*"),
	filepath.Join(cluster.StateDir, "registry", ".registry.sock.*"),
}

// staleTemporaries lists the plugin's temporary files that exist now.
func staleTemporaries() ([]string, error) {
	var out []string
	for _, g := range temporaryGlobs {
		m, err := filepath.Glob(g)
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", g, err)
		}
		for _, p := range m {
			out = append(out, "temporary file "+p)
		}
	}
	return out, nil
}
