//go:build chaos

// Package chaos is the chaos suite (`make chaos`, `make chaos-short`): on the local cluster
// (hack/cluster-up.sh, with the settings hack/chaos.sh gives it), faults are injected while vGPU
// pods churn — a claim and a pod (or two pods sharing a claim) created, the library registering
// and allocating inside each pod with vgpu_probe, then deleted, several at a time — and
// invariants are checked continuously during each fault, after each injection and when the churn
// has drained:
//
//   - no vGPU container runs without its per-container mounts and identity, or with another
//     container's (containerd's own view, contract §4);
//   - the plugin's checkpoint always parses and agrees with the kubelet's DRA state on every
//     claim the kubelet believes prepared; no claim is lost or duplicated; no CDI spec, claim
//     directory or per-container directory outlives its claim or container;
//   - every pod runs within a bound and its library registers and enforces;
//   - every error a user sees (pod events, container waiting messages) names its cause;
//   - the node-side enforcer acts on none of the pods (all stay within their limits);
//   - the plugin's memory, goroutines and open file descriptors return to their baseline.
//
// The faults: containerd SIGKILLed, the plugin SIGKILLed at random points of Prepares, the
// kubelet restarted, a node "reboot", the state dir's file system full, the API server
// unreachable. Each is driven by a script of hack/chaos/ (or hack/cluster-restart-containerd.sh).
// A summary table is printed at the end and written to _output/chaos/summary.txt.
package chaos

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/test/cluster"
)

// form is how much of each fault a run injects: CHAOS_FORM=full (make chaos) or short (make
// chaos-short, in CI).
type form struct {
	name string
	// Iterations of each fault.
	containerdKills, pluginKills, kubeletRestarts, reboots, diskFulls, apiOutages int
	// workers is how many churn loops run at once.
	workers int
	// maxPause is the longest random pause before an injection.
	maxPause time.Duration
}

// The short form makes two API outages: one outage's moment (the second pod's sandbox started)
// sometimes finds the kubelet still reading the claim itself, so NRI is never asked during it;
// the fault must meet NRI's read at least once (apiserver_test.go).
var forms = map[string]form{
	"full":  {name: "full", containerdKills: 20, pluginKills: 100, kubeletRestarts: 5, reboots: 3, diskFulls: 3, apiOutages: 3, workers: 3, maxPause: 8 * time.Second},
	"short": {name: "short", containerdKills: 3, pluginKills: 5, kubeletRestarts: 2, reboots: 1, diskFulls: 1, apiOutages: 2, workers: 3, maxPause: 4 * time.Second},
}

// apiOutage is how long the API server stays unreachable in each outage.
const apiOutage = 30 * time.Second

var c *cluster.Cluster

func TestMain(m *testing.M) {
	var err error
	if c, err = cluster.Connect(); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	scraper = c.MetricsScraper()
	code := m.Run()
	// No chaos pod goes over its limits: the enforcer must not have acted on any of them,
	// through every fault (plugin kills and restarts included).
	if code == 0 {
		if err := c.CheckNoFalsePositives(nil); err != nil {
			fmt.Fprintln(os.Stderr, "chaos: false positives of the node-side enforcer:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestChaos runs every fault in turn on one install, then checks that the node is clean and the
// plugin back at its baseline, and prints the summary.
func TestChaos(t *testing.T) {
	f, ok := forms[os.Getenv("CHAOS_FORM")]
	if !ok {
		t.Fatalf("CHAOS_FORM=%q: want full or short (make chaos, make chaos-short)", os.Getenv("CHAOS_FORM"))
	}
	s := newSuite(t, f)
	defer s.printSummary(t)
	for _, fl := range s.faults() {
		t.Run(fl.name, func(t *testing.T) { s.runFault(t, fl) })
	}
	s.finalChecks(t)
}
