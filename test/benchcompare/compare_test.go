//go:build benchcompare

// Package benchcompare runs vgpu-kubelet-plugin and Kubernetes' e2e DRA test driver side by
// side through the same kubelet-protocol harness against one real API server (etcd and
// kube-apiserver of the local cluster's binaries), interleaved over rounds, and reports the
// ratios of sequential Prepare and Unprepare, bursts, CPU, RSS, OS threads and API requests per
// claim (issue 18). `make bench-compare` builds what it needs and runs it (hack/bench-compare.sh);
// it needs root (the plugin mounts a tmpfs per claim) and is not part of CI.
package benchcompare

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
)

const (
	sequential   = 300 // claims prepared one per call, then unprepared one per call
	burst        = 100 // claims in one call; and calls from burstWorkers workers
	burstWorkers = 8
	held         = 800 // claims prepared at once for the RSS point
	warmup       = 10
)

// round is what one driver measured in one round.
type round struct {
	prepare, unprepare             []time.Duration // sequential, one claim per call
	burstPrepare, burstUnprepare   time.Duration   // burst claims in one call
	workerPrepare, workerUnprepare time.Duration   // burst calls from burstWorkers workers
	cpuPerCycle                    float64         // seconds of the driver's CPU per Prepare+Unprepare
	apiPerClaim                    float64         // API requests per claim prepared and unprepared
	rssIdle, rss100, rss800, peak  float64         // MiB
	anonIdle, fileIdle             float64         // MiB: RssAnon and RssFile of rssIdle
	threads                        float64         // after the workers' burst
}

// BenchmarkCompare measures both drivers in rounds, alternating which goes first; every figure
// is a median over the rounds and every ratio is ours over the test driver's.
func BenchmarkCompare(b *testing.B) {
	env := func(name string) string {
		v := os.Getenv(name)
		if v == "" {
			b.Fatalf("%s is not set: run this through make bench-compare (hack/bench-compare.sh)", name)
		}
		return v
	}
	binDir, testDriverExe, pluginExe := env("VGPU_BENCH_CLUSTER_BIN"), env("VGPU_BENCH_TEST_DRIVER"), env("VGPU_BENCH_PLUGIN")
	rounds := 3
	if v := os.Getenv("VGPU_BENCH_ROUNDS"); v != "" {
		rounds, _ = strconv.Atoi(v)
	}
	// The state of both drivers on this machine's disk (/var/tmp, not a tmpfs), their CDI
	// specs on a tmpfs, as /var/run/cdi is on a node.
	dir, err := os.MkdirTemp("/var/tmp", "vgbc-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unmountUnder(dir); _ = os.RemoveAll(dir) })
	api := startAPIServer(b, binDir, filepath.Join(dir, "api"))
	kube, err := kubernetes.NewForConfig(api.config)
	if err != nil {
		b.Fatal(err)
	}
	setupCluster(b, kube)
	cdiRoot := filepath.Join(dir, "cdi")
	mountTmpfs(b, cdiRoot)
	drivers := []*driver{ourPlugin(pluginExe, api.kubeconfig), testDriver(testDriverExe, api.kubeconfig)}
	for _, d := range drivers {
		d.claims = driverClaims(b, kube, d.driver, d.devices, d.shareable, held)
	}
	results := map[*driver][]round{}
	for r := range rounds {
		order := slices.Clone(drivers)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, d := range order {
			name := fmt.Sprintf("%d-%s", r, d.driver)
			rd := runRound(b, api, kube, d, filepath.Join(dir, name), filepath.Join(cdiRoot, name))
			results[d] = append(results[d], rd)
			b.Logf("round %d, %s: %s", r+1, d.name, rd)
		}
	}
	report(b, rounds, results[drivers[0]], results[drivers[1]])
}

// runRound starts the driver, measures it and stops it.
func runRound(b *testing.B, api *apiServer, kube kubernetes.Interface, d *driver, dir, cdiDir string) round {
	p, regSocket := d.start(b, dir, cdiDir)
	defer p.stop()
	k := register(b, regSocket, p)
	defer k.conn.Close()
	waitSlice(b, kube, d, p)
	time.Sleep(time.Second)
	var r round
	ok := mustOf(b)
	st := p.stats(b)
	r.rssIdle, r.anonIdle, r.fileIdle = mib(st.rssKiB), mib(st.anonKiB), mib(st.fileKiB)
	for _, c := range d.claims[held-warmup:] {
		ok(k.prepare(c))
		ok(k.unprepare(c))
	}
	time.Sleep(time.Second) // background work of the warm-up (our claim status writes) ends

	ctx := context.Background()
	cpu0, req0 := p.stats(b).cpu, api.requests(ctx, b)
	for i, c := range d.claims[:sequential] {
		r.prepare = append(r.prepare, ok(k.prepare(c)))
		if i == 99 {
			r.rss100 = mib(p.stats(b).rssKiB)
		}
	}
	for _, c := range d.claims[:sequential] {
		r.unprepare = append(r.unprepare, ok(k.unprepare(c)))
	}
	time.Sleep(time.Second) // requests a driver makes in the background are counted too
	r.cpuPerCycle = (p.stats(b).cpu - cpu0) / sequential
	r.apiPerClaim = (api.requests(ctx, b) - req0 - 1) / sequential // less the first /metrics read

	claims := d.claims[sequential : sequential+burst]
	r.burstPrepare = ok(k.prepare(claims...))
	r.burstUnprepare = ok(k.unprepare(claims...))
	claims = d.claims[sequential+burst : sequential+2*burst]
	r.workerPrepare = workers(b, burstWorkers, claims, k.prepare)
	r.workerUnprepare = workers(b, burstWorkers, claims, k.unprepare)
	r.threads = float64(p.stats(b).threads)

	for i := 0; i < held; i += burst {
		ok(k.prepare(d.claims[i : i+burst]...))
	}
	time.Sleep(time.Second)
	r.rss800 = mib(p.stats(b).rssKiB)
	for i := 0; i < held; i += burst {
		ok(k.unprepare(d.claims[i : i+burst]...))
	}
	r.peak = mib(p.stats(b).hwmKiB)
	return r
}

func mib(kib int64) float64 { return float64(kib) / 1024 }

// String is the round's figures on one line, for the log.
func (r round) String() string {
	var sb strings.Builder
	for _, m := range measures {
		fmt.Fprintf(&sb, "%s %.2f%s  ", m.key, m.of(r), m.unit)
	}
	return sb.String()
}
