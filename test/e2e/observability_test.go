//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vgpu-dra/vgpu-dra/pkg/clusterview"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

const mib = int64(1) << 20

// obsShare is one of the two pods of this test: its claim and what its probe holds.
type obsShare struct {
	name        string
	memory      string // the claim's request
	memoryBytes int64
	cores       int64
	holdMiB     int64 // what vgpu_probe allocates and holds through libvgpu.so
}

// TestObservability: two pods share the simulated GPU, each holding memory through the real
// libvgpu.so (vgpu_probe over the fake driver). The plugin's /metrics shows both containers
// with their limits and usage, and kubectl vgpu shows the GPU with both shares and what is
// left. A real Prometheus scrapes the plugin and the webhook as the chart's README says, with the
// chart's PrometheusRule: the alerts the local cluster can provoke fire together (a container
// over 90 %, a refused allocation, an enforcer kill, an unhealthy GPU), every query of the
// chart's dashboard has data, and the alerts resolve once their cause is gone; once the pods are
// deleted their series are gone.
func TestObservability(t *testing.T) {
	installChart(t)
	ensureNamespace(t)
	// Started before the pods, Prometheus sees their Prepares and registrations (the
	// dashboard's rates), and the near-limit alert's minute runs beside the checks below.
	prom := startPrometheus(t)
	promStart := time.Now()
	shares := []obsShare{
		{name: "obs-a", memory: "10Gi", memoryBytes: 10 << 30, cores: 30, holdMiB: 9400}, // 91.8 %: the alert fires
		{name: "obs-b", memory: "4Gi", memoryBytes: 4 << 30, cores: 20, holdMiB: 1024},   // 25 %: it does not
	}
	t.Cleanup(func() { cleanupShares(t, shares) })
	for _, s := range shares {
		createClaim(t, claimFor(s.name, s.memory, s.cores))
		createPod(t, vgpuPod(s.name, s.name, "sh", "-c", fmt.Sprintf(
			`FAKE_GPU_DEVICES="$MANAGER_VISIBLE_DEVICE_0:144384" vgpu_probe hold %d >/tmp/hold.out 2>&1 & trap 'exit 0' TERM; while :; do sleep 1; done`, s.holdMiB)))
	}
	pids := map[string][]int{}
	for _, s := range shares {
		waitRunning(t, s.name)
		eventually(t, defaultTimeout, s.name+"'s probe holding its memory", func() (bool, error) {
			out, err := run(t, "kubectl", "exec", "-n", testNS, s.name, "-c", "app", "--", "cat", "/tmp/hold.out")
			return err == nil && strings.Contains(out, "held"), fmt.Errorf("%v: %s", err, out)
		})
		pids[s.name] = pidLines(execIn(t, s.name, "cat /etc/vgpu-dra/config/pids.config"))
	}
	metricsTarget := net.JoinHostPort(pluginPodIP(t), "8080")
	uuid := gpuUUID(t)

	t.Run("metrics-show-both-containers", func(t *testing.T) {
		for _, s := range shares {
			wantCores := 0.0
			for _, pid := range pids[s.name] {
				wantCores += float64(gpu.SimulatedSMUtil(pid, float64(s.cores)/float64(len(pids[s.name]))))
			}
			want := map[string]float64{
				"vgpu_dra_container_memory_used_bytes":   float64(s.holdMiB * mib),
				"vgpu_dra_container_memory_limit_bytes":  float64(s.memoryBytes),
				"vgpu_dra_container_cores_limit_percent": float64(s.cores),
				"vgpu_dra_container_cores_used_percent":  min(wantCores, 100),
			}
			labels := map[string]string{"namespace": testNS, "pod": s.name, "container": "app", "claim": s.name, "gpu_uuid": uuid}
			eventually(t, defaultTimeout, s.name+"'s series on /metrics", func() (bool, error) {
				m, err := scrapeMetrics(metricsTarget)
				if err != nil {
					return false, err
				}
				for name, v := range want {
					if got, ok := seriesValue(m, name, labels); !ok || got != v {
						return false, fmt.Errorf("%s%v = %v (present %v), want %v", name, labels, got, ok, v)
					}
				}
				return true, nil
			})
		}
		m, err := scrapeMetrics(metricsTarget)
		if err != nil {
			t.Fatal(err)
		}
		for name, want := range map[string]float64{"vgpu_dra_gpu_shares": 2, "vgpu_dra_gpu_containers": 2, "vgpu_dra_gpu_memory_allocated_bytes": 14 << 30, "vgpu_dra_gpu_healthy": 1} {
			if got, ok := seriesValue(m, name, map[string]string{"gpu_uuid": uuid, "device": "gpu-0"}); !ok || got != want {
				t.Errorf("%s{gpu-0} = %v (present %v), want %v", name, got, ok, want)
			}
		}
	})

	t.Run("kubectl-vgpu-shows-both-shares-and-what-is-left", func(t *testing.T) {
		table := kubectlVGPU(t, "nodes")
		t.Logf("kubectl vgpu nodes:\n%s", table)
		var list struct{ Items []clusterview.GPU }
		if err := json.Unmarshal([]byte(kubectlVGPU(t, "nodes", "-o", "json")), &list); err != nil || len(list.Items) != 1 {
			t.Fatalf("kubectl vgpu nodes -o json: %d GPUs, %v", len(list.Items), err)
		}
		g := list.Items[0]
		published := int64(144384) * mib // the simulated H200, nothing reserved
		if g.Device != "gpu-0" || g.Memory.Published != published || g.Memory.Allocated != 14<<30 || g.Memory.Free != published-14<<30 ||
			g.Cores.Allocated != 50 || g.Cores.Free != 50 || len(g.Shares) != 2 || g.Shares[0].Claim != "obs-a" || g.Shares[1].Claim != "obs-b" {
			t.Errorf("kubectl vgpu nodes -o json: %+v", g)
		}
		// The table a person reads: 141Gi published, 14Gi taken, 127Gi and 50 % left, 2 shares.
		fields := strings.Fields(strings.Split(strings.TrimSpace(table), "\n")[1])
		if want := []string{"141Gi", "14Gi", "127Gi", "100%", "50%", "50%", "2", "Healthy"}; strings.Join(fields[2:], " ") != strings.Join(want, " ") {
			t.Errorf("kubectl vgpu nodes row %v, want node, gpu-0, then %v", fields, want)
		}
		pods := kubectlVGPU(t, "pods", "-n", testNS, "-o", "wide")
		t.Logf("kubectl vgpu pods -n %s -o wide:\n%s", testNS, pods)
		rows := map[string][]string{}
		for _, line := range strings.Split(strings.TrimSpace(pods), "\n")[1:] {
			f := strings.Fields(line)
			rows[f[0]] = f
		}
		for _, s := range shares {
			// POD CLAIM NODE DEVICE MEMORY CORES CLASS CEILING REQUEST UUID CONTAINERS: the
			// shares have no VGPUConfig, so they are guaranteed, without a burst.
			f := rows[s.name]
			if len(f) != 11 || f[1] != s.name || f[3] != "gpu-0" || f[4] != s.memory || f[5] != fmt.Sprintf("%d%%", s.cores) ||
				f[6] != "Guaranteed" || f[7] != "-" || f[10] != "app" {
				t.Errorf("kubectl vgpu pods row of %s: %v", s.name, f)
			}
		}
	})

	t.Run("metrics-only-for-a-permitted-token", func(t *testing.T) {
		checkMetricsRefused(t, metricsTarget)
	})

	t.Run("prometheus-scrapes-the-webhook", func(t *testing.T) {
		// The pods above went through the webhook (patched): its series are in Prometheus.
		eventually(t, defaultTimeout, "the webhook's admissions in Prometheus", func() (bool, error) {
			r, err := prom.query(`sum by (component) (vgpu_dra_webhook_admissions_total{component="webhook",kind="Pod",decision="patched"})`)
			return err == nil && len(withData(r)) == 1, fmt.Errorf("%+v %v", r, err)
		})
	})

	provoked := []wantAlert{
		{"VGPUContainerNearMemoryLimit", map[string]string{"pod": "obs-a", "namespace": testNS, "claim": "obs-a", "severity": "warning"}},
		{"VGPUMemoryAllocationsRefused", map[string]string{"pod": "obs-b", "namespace": testNS, "claim": "obs-b", "severity": "warning"}},
		{"VGPUEnforcerKilledProcesses", map[string]string{"action": "kill", "reason": "over-limit", "component": "kubelet-plugin", "severity": "warning"}},
		{"VGPUDeviceUnhealthy", map[string]string{"device": "gpu-0", "gpu_uuid": uuid, "severity": "critical"}},
	}
	t.Run("prometheus-fires-the-alerts", func(t *testing.T) {
		// obs-b asks for more than its limit leaves (1 GiB held of 4 GiB): refused.
		out := probeOutput(execIn(t, "obs-b", `FAKE_GPU_DEVICES="$MANAGER_VISIBLE_DEVICE_0:144384" vgpu_probe alloc 4096 2>/dev/null; echo "exit $?"`))
		if out != "alloc 4096 MiB = 2\nexit 0\n" {
			t.Fatalf("vgpu_probe alloc 4096 in obs-b printed %q, want it refused (2)", out)
		}
		// The GPU says obs-b's holding probe has 6 GiB, past its 4 GiB and the slack: the
		// enforcer kills it (obs-b is one of the suite's misbehaving pods).
		holder := hostPID(t, "obs-b", "vgpu_probe")
		setProcessMemory(t, uuid, holder, 6<<30)
		eventually(t, 30*time.Second, "obs-b's probe killed", func() (bool, error) {
			_, err := os.Stat(fmt.Sprintf("/proc/%d", holder))
			return os.IsNotExist(err), err
		})
		// An XID makes the GPU unhealthy (NoSchedule: the pods keep running).
		controlPOST(t, "/gpus/"+uuid+"/xid/92")
		provokedAt := time.Now()
		for name, why := range notProvoked {
			t.Logf("%s is not provoked here: %s (test/monitoring/alerts_test.yaml covers it)", name, why)
		}
		// The near-limit rule holds for 1 minute (counted from obs-a's first sample over 90 %);
		// the others fire at the next evaluation. A limit that covers it, the scrapes and the
		// evaluations around it.
		fired := prom.waitAlertsFiring(t, 3*time.Minute, provoked, func(a promAlert) bool {
			// obs-a's near-limit alert while pending.
			return provoked[0].matches(a)
		})
		t.Logf("all %d fired %v after Prometheus started, %v after the last was provoked", len(provoked),
			time.Since(promStart).Round(time.Second), time.Since(provokedAt).Round(time.Second))
		for _, a := range fired {
			t.Logf("%s firing: %s", a.Labels["alertname"], a.Annotations["summary"])
		}
	})

	t.Run("every-dashboard-query-has-data", func(t *testing.T) {
		queries := dashboardQueries(t)
		if len(queries) < 10 {
			t.Fatalf("the dashboard has %d queries, want its panels' (at least 10)", len(queries))
		}
		for _, q := range queries {
			r, err := prom.query(q.expr)
			if err != nil {
				t.Errorf("panel %q: %s: %v", q.panel, q.expr, err)
				continue
			}
			data := withData(r)
			switch why := noDataReason(q); {
			case why == "" && len(data) == 0:
				t.Errorf("panel %q shows nothing: %s returned %v", q.panel, q.expr, r)
			case why != "" && len(data) > 0:
				t.Errorf("panel %q: %s has data %v, though listed as having none here (%s)", q.panel, q.expr, data, why)
			case why != "":
				t.Logf("panel %q: %s has no data here: %s", q.panel, q.expr, why)
			}
		}
	})

	t.Run("prometheus-resolves-the-device-alert", func(t *testing.T) {
		// Healthy again without a reset (a reset is fatal: NoExecute would evict the pods).
		controlPOST(t, "/gpus/"+uuid+"/healthy")
		prom.waitAlertGone(t, 30*time.Second, provoked[3])
		// The other alerts' causes are still there: obs-a still over 90 %.
		if !prom.firing(t, provoked[0]) {
			t.Errorf("%s stopped firing while obs-a still holds its memory", provoked[0].name)
		}
		// The two alerts over a counter's increase() stay for their window after the last
		// refusal or kill (5 and 10 minutes) by design; promtool's tests see them resolve.
		t.Logf("VGPUMemoryAllocationsRefused and VGPUEnforcerKilledProcesses resolve 5 and 10 minutes after the event (their increase() window): not waited for here")
	})
	t.Cleanup(func() {
		// Whatever failed above, the GPU is healthy again for the tests that follow.
		if resp, err := controlClient().Post("http://localhost/gpus/"+uuid+"/healthy", "text/plain", nil); err == nil {
			resp.Body.Close()
		}
	})

	t.Run("series-vanish-with-the-pods", func(t *testing.T) {
		if !prom.firing(t, provoked[0]) {
			t.Fatalf("%s is not firing before obs-a is deleted", provoked[0].name)
		}
		for _, s := range shares {
			deletePod(t, s.name)
		}
		eventually(t, defaultTimeout, "the containers' series gone from /metrics", func() (bool, error) {
			m, err := scrapeMetrics(metricsTarget)
			if err != nil {
				return false, err
			}
			for _, name := range []string{"vgpu_dra_container_memory_used_bytes", "vgpu_dra_container_memory_limit_bytes", "vgpu_dra_container_cores_used_percent", "vgpu_dra_container_memory_refusals_total"} {
				for _, s := range shares {
					if _, ok := seriesValue(m, name, map[string]string{"pod": s.name}); ok {
						return false, fmt.Errorf("%s of %s still there", name, s.name)
					}
				}
			}
			_, gpuThere := seriesValue(m, "vgpu_dra_gpu_healthy", map[string]string{"device": "gpu-0"})
			return gpuThere, fmt.Errorf("the GPU's series went too")
		})
		// Its container's series gone, obs-a's near-limit alert resolves.
		prom.waitAlertGone(t, 30*time.Second, provoked[0])
	})
}

// cleanupShares deletes the test's pods and claims and waits until the kubelet has unprepared
// the claims, so the next test finds the GPU whole.
func cleanupShares(t *testing.T, shares []obsShare) {
	ctx := context.Background()
	for _, s := range shares {
		_ = kube.CoreV1().Pods(testNS).Delete(ctx, s.name, metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](0)})
		_ = kube.ResourceV1().ResourceClaims(testNS).Delete(ctx, s.name, metav1.DeleteOptions{})
	}
	eventually(t, defaultTimeout, "the test's claims unprepared", func() (bool, error) {
		specs, _ := filepathGlob("/var/run/cdi/" + driverName + "-claim_*.json")
		list, err := kube.ResourceV1().ResourceClaims(testNS).List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) == 0 && len(specs) == 0, fmt.Errorf("claims %d, specs %v, %v", len(list.Items), specs, err)
	})
}

// kubectlVGPU runs `kubectl vgpu`: kubectl finds its plugin kubectl-vgpu (make build) on PATH.
func kubectlVGPU(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "kubectl"), append([]string{"vgpu"}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+filepath.Join(repoRoot, "_output", "bin")+":"+os.Getenv("PATH"))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl vgpu %s: %v (%s)", strings.Join(args, " "), err, stderrOf(err))
	}
	return string(out)
}

func stderrOf(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}

func pluginPodIP(t *testing.T) string {
	t.Helper()
	var ip string
	eventually(t, defaultTimeout, "the plugin pod's IP", func() (bool, error) {
		pods, err := kube.CoreV1().Pods(pluginNS).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=kubelet-plugin"})
		if err != nil || len(pods.Items) != 1 {
			return false, fmt.Errorf("%d plugin pods, %v", len(pods.Items), err)
		}
		ip = pods.Items[0].Status.PodIP
		return ip != "", fmt.Errorf("no pod IP yet")
	})
	return ip
}

func gpuUUID(t *testing.T) string {
	t.Helper()
	list, err := kube.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: "spec.driver=" + driverName})
	if err != nil || len(list.Items) != 1 || len(list.Items[0].Spec.Devices) != 1 {
		t.Fatalf("the node's slice: %v", err)
	}
	return *list.Items[0].Spec.Devices[0].Attributes["uuid"].StringValue
}

// checkMetricsRefused: the plugin's /metrics (metrics.auth delegated, the chart's default)
// answers 401 without a token and 403 to the token of a service account that is not bound to
// <release>-metrics-reader: the plugin reviews tokens and access through the API server with the
// chart's RBAC (contract §8).
func checkMetricsRefused(t *testing.T, hostPort string) {
	ctx := context.Background()
	sas := kube.CoreV1().ServiceAccounts(testNS)
	const stranger = "metrics-stranger"
	if _, err := sas.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: stranger}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tr, err := sas.CreateToken(ctx, stranger, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for _, tc := range []struct {
		who, token string
		want       int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"service account " + testNS + "/" + stranger, tr.Status.Token, http.StatusForbidden},
	} {
		req, err := http.NewRequest(http.MethodGet, "https://"+hostPort+"/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Errorf("/metrics as %s: %v", tc.who, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("/metrics as %s: %s %s, want %d", tc.who, resp.Status, body, tc.want)
		}
	}
}

// scrapeMetrics reads the /metrics endpoint at hostPort as Prometheus does (scraper: HTTPS, a
// token allowed to get /metrics).
func scrapeMetrics(hostPort string) (map[string]*dto.MetricFamily, error) {
	body, err := scraper.Get(context.Background(), hostPort)
	if err != nil {
		return nil, err
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(bytes.NewReader(body))
}

// seriesValue is the value of the series of name whose labels include want.
func seriesValue(m map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	for _, s := range m[name].GetMetric() {
		match := true
		for _, l := range s.GetLabel() {
			if v, ok := want[l.GetName()]; ok && v != l.GetValue() {
				match = false
			}
		}
		if match {
			return s.GetGauge().GetValue() + s.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

// prometheus is a Prometheus server (Debian's package) this test started.
type prometheus struct {
	url string
}

type promAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
}

// startPrometheus runs /usr/bin/prometheus scraping the chart's pods every second
// (promScrapeConfig: the kubelet plugin's and each webhook replica's /metrics) with the chart's
// rendered PrometheusRule as its rule file, evaluated every second, and stops it when the test
// ends (SIGTERM, SIGKILL after 10 s). It scrapes as the chart's README says to: HTTPS without
// verifying the self-signed certificate, with the token of a service account bound to
// <release>-metrics-reader. It returns once every target is up and every rule loaded.
func startPrometheus(t *testing.T) *prometheus {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus not found (Debian package prometheus; hack/install-test-deps.sh installs it): %v", err)
	}
	dir := t.TempDir()
	port := freePort(t)
	rules, alerts := chartRuleFile(t, dir)
	token, err := scraper.Token(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	scrape, listed := promScrapeConfig(t, dir, tokenFile)
	config := fmt.Sprintf("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - %s\nscrape_configs:\n", rules) + scrape
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address=127.0.0.1:"+strconv.Itoa(port), "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start prometheus: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			log, _ := os.ReadFile(logFile.Name())
			t.Logf("prometheus log:\n%s", log)
		}
		logFile.Close()
	})
	p := &prometheus{url: "http://127.0.0.1:" + strconv.Itoa(port)}
	eventually(t, defaultTimeout, "prometheus ready and scraping the plugin and the webhook", func() (bool, error) {
		select {
		case <-exited:
			log, _ := os.ReadFile(logFile.Name())
			t.Fatalf("prometheus exited:\n%s", log)
		default:
		}
		targets, err := p.targets()
		if err != nil {
			return false, err
		}
		return scrapesAll(targets, listed)
	})
	loaded, err := p.alertingRules()
	if err != nil || !slices.Equal(loaded, alerts) || len(alerts) < 6 {
		t.Fatalf("prometheus loaded the alerting rules %v (%v), the chart's PrometheusRule has %v", loaded, err, alerts)
	}
	return p
}

func (p *prometheus) alerts() ([]promAlert, error) {
	var r struct {
		Data struct {
			Alerts []promAlert `json:"alerts"`
		} `json:"data"`
	}
	err := p.get("/api/v1/alerts", &r)
	return r.Data.Alerts, err
}

func (p *prometheus) get(path string, into any) error {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(p.url + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, body)
	}
	return json.Unmarshal(body, into)
}

// freePort is a loopback port nothing listens on right now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
