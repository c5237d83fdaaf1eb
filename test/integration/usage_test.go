package integration

import (
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/plugin"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
	"github.com/vgpu-dra/vgpu-dra/pkg/usage/usagetest"
)

// scrape reads the plugin's /metrics over HTTP, as Prometheus does, and returns the families.
func scrape(t *testing.T, n *node) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + n.plugin.MetricsAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return families
}

// series returns the value of the series of family name whose labels include want, and
// whether there is one.
func series(families map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	for _, m := range families[name].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			match = match && labels[k] == v
		}
		if match {
			return m.GetGauge().GetValue() + m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

// TestUsageMetrics: two containers of two pods share GPU 0 through the NRI path of
// containerd's own runtime side; their processes register with the real registry. The
// plugin's /metrics then shows each with its limits (from its vgpu.config), its memory (from
// the ledger the library would write) and its SM use (the simulated GPU's samples of the PIDs
// the registry wrote), and the GPU with both shares; a stopped container's series are gone.
func TestUsageMetrics(t *testing.T) {
	n := newNode(t, func(c *plugin.Config) {
		// Sampled once at start-up, then only when the test asks: no waiting on a ticker.
		c.MetricsAddress, c.UsageInterval = "127.0.0.1:0", time.Hour
	})
	n.start()
	k := n.register()
	n.waitSession(1)
	ctx := t.Context()
	type ctr struct {
		id, claim, memory, shareID string
		limitMem, limitCores, used float64
		dir                        string
		pod                        *api.PodSandbox
	}
	ctrs := []*ctr{
		{id: "ctr-a", claim: "a", memory: "4Gi", shareID: shareN1, limitMem: 4 << 30, limitCores: 30, used: 3 << 30},
		{id: "ctr-b", claim: "b", memory: "2Gi", shareID: shareN2, limitMem: 2 << 30, limitCores: 10, used: 0},
	}
	for _, c := range ctrs {
		claim := n.newClaim(c.claim, allocated{request: "gpu", device: "gpu-0", memory: c.memory, cores: int64(c.limitCores), shareID: c.shareID})
		resp := k.prepare(t, claim)[string(claim.UID)]
		c.pod = podOf(claim)
		if err := n.nri.runPod(ctx, c.pod); err != nil {
			t.Fatal(err)
		}
		if _, err := n.nri.create(ctx, c.pod.Id, n.vgpuContainer(c.id, "app", resp, string(claim.UID))); err != nil {
			t.Fatalf("CreateContainer %s: %v", c.id, err)
		}
		if err := n.nri.start(ctx, c.id, uint32(os.Getpid())); err != nil {
			t.Fatal(err)
		}
		rc := registry.Client{Socket: n.cfg.Layout().RegistrySocket()}
		if res, err := rc.Register(ctx, registry.Request{PodUID: c.pod.Uid, ContainerName: "app"}); err != nil || res.Response.Status != registry.StatusOK {
			t.Fatalf("register %s: %+v %v", c.id, res, err)
		}
		c.dir = filepath.Join(n.claimDir(string(claim.UID)), c.pod.Uid+"_app")
	}
	// What libvgpu.so in ctr-a would have written: 3 GiB in a live process, 2 refusals. ctr-b
	// has run no CUDA yet: no ledger, nothing used.
	usagetest.WriteLedger(t, filepath.Join(ctrs[0].dir, "vmem_node"), usagetest.Ledger{
		Refused: 2, Slots: []usagetest.Slot{usagetest.Live(map[int]uint64{0: 3 << 30})},
	})
	// Both containers' processes are this test's cgroup: the SM use is the simulated samples
	// of the PIDs the registry listed, each within its share of the container's cores (and
	// both containers list the same PIDs: the GPU reports each once, in the smaller share, b's).
	pidLines := strings.Fields(readFile(t, filepath.Join(ctrs[0].dir, "config", contract.PIDsConfigName)))
	var wantCores float64
	for _, line := range pidLines {
		pid, _ := strconv.Atoi(line)
		wantCores += float64(gpu.SimulatedSMUtil(pid, ctrs[1].limitCores/float64(len(pidLines))))
	}
	wantCores = min(wantCores, 100)
	n.plugin.Usage().Sample(ctx)

	m := scrape(t, n)
	uuid := n.gpuUUID(0)
	for _, c := range ctrs {
		l := map[string]string{"namespace": "default", "pod": c.claim + "-pod", "container": "app", "claim": c.claim, "gpu_uuid": uuid}
		for name, want := range map[string]float64{
			"vgpu_dra_container_memory_limit_bytes":  c.limitMem,
			"vgpu_dra_container_cores_limit_percent": c.limitCores,
			"vgpu_dra_container_memory_used_bytes":   c.used,
			"vgpu_dra_container_cores_used_percent":  wantCores,
			// No VGPUConfig: guaranteed, no burst (contract §16).
			"vgpu_dra_container_cores_ceiling_percent": c.limitCores,
		} {
			if got, ok := series(m, name, l); !ok || got != want {
				t.Errorf("%s%v = %v (present %v), want %v", name, l, got, ok, want)
			}
		}
		classed := map[string]string{"class": "Guaranteed"}
		maps.Copy(classed, l)
		if got, ok := series(m, "vgpu_dra_container_cores_class_info", classed); !ok || got != 1 {
			t.Errorf("vgpu_dra_container_cores_class_info%v = %v (present %v), want 1", classed, got, ok)
		}
		// The node enforces nothing here: no arbiter, no allowance.
		if got, ok := series(m, "vgpu_dra_container_cores_allowance_percent", l); ok {
			t.Errorf("vgpu_dra_container_cores_allowance_percent%v = %v without an arbiter", l, got)
		}
	}
	if got, ok := series(m, "vgpu_dra_container_memory_refusals_total", map[string]string{"claim": "a", "pod": "a-pod"}); !ok || got != 2 {
		t.Errorf("refusals of a = %v (present %v), want 2", got, ok)
	}
	gpu0 := map[string]string{"gpu_uuid": uuid, "device": "gpu-0"}
	for name, want := range map[string]float64{
		"vgpu_dra_gpu_memory_allocated_bytes": 6 << 30, "vgpu_dra_gpu_cores_allocated_percent": 40,
		"vgpu_dra_gpu_memory_published_bytes": 144384 << 20, "vgpu_dra_gpu_cores_published_percent": 100,
		"vgpu_dra_gpu_shares": 2, "vgpu_dra_gpu_containers": 2, "vgpu_dra_gpu_healthy": 1,
	} {
		if got, ok := series(m, name, gpu0); !ok || got != want {
			t.Errorf("%s{gpu-0} = %v (present %v), want %v", name, got, ok, want)
		}
	}

	// ctr-a stops: its series vanish with the next sample; ctr-b's stay.
	if err := n.nri.stop(ctx, "ctr-a"); err != nil {
		t.Fatal(err)
	}
	n.plugin.Usage().Sample(ctx)
	m = scrape(t, n)
	for _, name := range []string{"vgpu_dra_container_memory_limit_bytes", "vgpu_dra_container_memory_used_bytes", "vgpu_dra_container_memory_refusals_total"} {
		if _, ok := series(m, name, map[string]string{"pod": "a-pod"}); ok {
			t.Errorf("%s of the stopped container is still there", name)
		}
	}
	if _, ok := series(m, "vgpu_dra_container_memory_limit_bytes", map[string]string{"pod": "b-pod"}); !ok {
		t.Error("the running container's series went with the stopped one's")
	}
	if got, _ := series(m, "vgpu_dra_gpu_containers", gpu0); got != 1 {
		t.Errorf("gpu_containers after one stopped = %v, want 1", got)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// gpuUUID is the UUID of the node's simulated GPU at index i.
func (n *node) gpuUUID(i int) string {
	n.t.Helper()
	devs, err := n.gpus.Devices(n.t.Context())
	if err != nil {
		n.t.Fatal(err)
	}
	return devs[i].UUID
}
