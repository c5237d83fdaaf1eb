package plugin

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	k8smetrics "k8s.io/component-base/metrics"

	"github.com/vgpu-dra/vgpu-dra/pkg/component"
)

// recordingRegistry is the plugin's registry that also notes the name of every metric
// registered on it, whether or not it has a sample yet: a scrape leaves out a labelled metric
// until its first label value, so scraping alone cannot tell what the plugin exports.
type recordingRegistry struct {
	k8smetrics.KubeRegistry
	mu    sync.Mutex
	names map[string]bool
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *recordingRegistry) note(c prometheus.Collector) {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	r.mu.Lock()
	defer r.mu.Unlock()
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			r.names[m[1]] = true
		}
	}
}

func (r *recordingRegistry) MustRegister(cs ...k8smetrics.Registerable) {
	r.KubeRegistry.MustRegister(cs...)
	for _, c := range cs {
		r.note(c)
	}
}

func (r *recordingRegistry) Register(c k8smetrics.Registerable) error {
	if err := r.KubeRegistry.Register(c); err != nil {
		return err
	}
	r.note(c)
	return nil
}

func (r *recordingRegistry) CustomMustRegister(cs ...k8smetrics.StableCollector) {
	r.KubeRegistry.CustomMustRegister(cs...)
	for _, c := range cs {
		r.note(c)
	}
}

func (r *recordingRegistry) CustomRegister(c k8smetrics.StableCollector) error {
	if err := r.KubeRegistry.CustomRegister(c); err != nil {
		return err
	}
	r.note(c)
	return nil
}

// TestMonitoringNamesExportedMetrics starts the plugin as a node runs it (NRI, usage metrics)
// and checks that every vgpu_dra_* metric the chart's alert rules and Grafana dashboard name
// is one the plugin registers: a renamed or removed metric fails here, not on a user's empty
// dashboard. Histogram series (_bucket, _sum, _count) count as their histogram's.
func TestMonitoringNamesExportedMetrics(t *testing.T) {
	cfg := testConfig(t)
	cfg.UsageInterval = time.Hour
	reg := &recordingRegistry{KubeRegistry: component.NewMetricsRegistry(), names: map[string]bool{}}
	deps := testDeps()
	deps.MetricsRegistry = reg
	p, err := Start(t.Context(), cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	reg.mu.Lock()
	exported := reg.names
	reg.mu.Unlock()
	// The usage series, which the dashboard is mostly about, must be among them: otherwise
	// this test would be checking against too little.
	for _, must := range []string{"vgpu_dra_container_memory_used_bytes", "vgpu_dra_gpu_healthy", "vgpu_dra_nri_lost_seconds", "vgpu_dra_prepare_duration_seconds"} {
		if !exported[must] {
			t.Fatalf("the plugin did not register %s; registered: %v", must, slices.Sorted(maps.Keys(exported)))
		}
	}

	chart := filepath.Join("..", "..", "deployments", "helm", "vgpu-dra", "files")
	dashboard := readChartFile(t, filepath.Join(chart, "dashboard.json"))
	var parsed struct {
		Panels []struct {
			Targets []struct{ Expr string } `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(dashboard), &parsed); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	exprs := 0
	for _, p := range parsed.Panels {
		exprs += len(p.Targets)
	}
	for file, content := range map[string]string{"alerts.yaml": readChartFile(t, filepath.Join(chart, "alerts.yaml")), "dashboard.json": dashboard} {
		named := map[string]bool{}
		for _, name := range regexp.MustCompile(`vgpu_dra_[a-z0-9_]+`).FindAllString(content, -1) {
			named[name] = true
		}
		if len(named) < 5 {
			t.Fatalf("%s names only %v: not the file this test is about?", file, named)
		}
		for name := range named {
			base := name
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if trimmed, ok := strings.CutSuffix(name, suffix); ok && exported[trimmed] {
					base = trimmed
				}
			}
			if !exported[base] {
				t.Errorf("%s names %s, which the plugin does not export", file, name)
			}
		}
	}
	if exprs < 10 {
		t.Errorf("dashboard.json has %d queries, want its panels' (at least 10)", exprs)
	}
}

func readChartFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
