//go:build chaos

package chaos

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/vgpu-dra/vgpu-dra/test/cluster"
)

// metricsPort is the chart's metricsPort: the plugin serves /metrics there on its pod IP.
const metricsPort = "8080"

// Leak tolerances: how far above the baseline the plugin may be once the churn has drained and
// nothing is prepared. A leak per pod or per fault (hundreds of pods, tens of restarts of
// containerd) goes far past them; RSS is given room for the Go heap's own slack.
const (
	goroutineSlack = 5
	fdSlack        = 5
	rssSlackBytes  = 24 << 20
)

// figures are the plugin's process figures from its /metrics (contract §8: go_* and process_*
// next to the plugin's own).
type figures struct {
	pod          string
	restarts     int32
	rss, heap    float64 // bytes
	goroutines   int
	fds          int
	nriConnected bool
	// nriCreateErrors is vgpu_dra_nri_errors_total{hook="create_container"}: containers the NRI
	// plugin failed (since this process started).
	nriCreateErrors float64
}

func (f figures) String() string {
	return fmt.Sprintf("RSS %.1f MiB (heap %.1f MiB), %d goroutines, %d fds", f.rss/(1<<20), f.heap/(1<<20), f.goroutines, f.fds)
}

// scraper reads the plugin's /metrics as a Prometheus bound to the chart's metrics-reader role
// would (HTTPS, a token allowed to get /metrics; the chart's default metrics.auth).
var scraper *cluster.MetricsScraper

// figuresOf scrapes the plugin pod's /metrics.
func (s *suite) figuresOf(ctx context.Context, p *corev1.Pod) (figures, error) {
	f := figures{pod: p.Name}
	for _, st := range p.Status.ContainerStatuses {
		f.restarts += st.RestartCount
	}
	if p.Status.PodIP == "" {
		return f, fmt.Errorf("plugin pod %s has no IP", p.Name)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	body, err := scraper.Get(ctx, net.JoinHostPort(p.Status.PodIP, metricsPort))
	if err != nil {
		return f, fmt.Errorf("scrape the plugin's metrics: %w", err)
	}
	values, err := parseMetrics(bytes.NewReader(body))
	if err != nil {
		return f, err
	}
	f.rss = values["process_resident_memory_bytes"]
	f.heap = values["go_memstats_heap_inuse_bytes"]
	f.goroutines = int(values["go_goroutines"])
	f.fds = int(values["process_open_fds"])
	f.nriConnected = values["vgpu_dra_nri_connected"] == 1
	f.nriCreateErrors = values[`vgpu_dra_nri_errors_total{hook="create_container"}`]
	if f.goroutines == 0 || f.fds == 0 || f.rss == 0 {
		return f, fmt.Errorf("the plugin's metrics lack go_goroutines, process_open_fds or process_resident_memory_bytes")
	}
	return f, nil
}

// parseMetrics reads Prometheus' text format into series → value (the series as written, labels
// included).
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read the plugin's metrics: %w", err)
	}
	return out, nil
}

// baselineWindow is how long the baseline is watched: the plugin's goroutines and descriptors
// move by a few with the kubelet's probes, the registry's socket check and the scrape itself, so
// the baseline is their floor over the window.
const baselineWindow = 10 * time.Second

// baselineFigures watches the plugin for baselineWindow and returns the floor of its figures.
func (s *suite) baselineFigures() (figures, error) {
	ctx := context.Background()
	var floor figures
	for end := time.Now().Add(baselineWindow); time.Now().Before(end); time.Sleep(cluster.PollInterval) {
		p, err := s.pluginPod(ctx)
		if err != nil {
			return floor, err
		}
		f, err := s.figuresOf(ctx, p)
		if err != nil {
			return floor, err
		}
		if floor.goroutines == 0 {
			floor = f
		}
		floor.goroutines, floor.fds = min(floor.goroutines, f.goroutines), min(floor.fds, f.fds)
		floor.rss, floor.heap = min(floor.rss, f.rss), min(floor.heap, f.heap)
	}
	return floor, nil
}

// settledFigures waits until a reading of the plugin's goroutines, file descriptors and RSS is
// back at base (within the slack above), and returns the last reading.
func (s *suite) settledFigures(base figures) (figures, error) {
	ctx := context.Background()
	var f figures
	err := cluster.Poll(ctx, 90*time.Second, func() (bool, error) {
		p, err := s.pluginPod(ctx)
		if err != nil {
			return false, err
		}
		if f, err = s.figuresOf(ctx, p); err != nil {
			return false, err
		}
		return f.goroutines <= base.goroutines+goroutineSlack && f.fds <= base.fds+fdSlack && f.rss <= base.rss+rssSlackBytes,
			fmt.Errorf("%s, baseline %s", f, base)
	})
	return f, err
}
