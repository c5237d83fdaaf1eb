//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The monitoring stack as a user runs it, for TestObservability: the test's Prometheus
// (startPrometheus) finds the plugin's and the webhook's pods by their `metrics` port, scrapes
// them as the chart's README says, and evaluates the chart's rendered PrometheusRule.

// chartRuleFile renders the chart's PrometheusRule (prometheusRule.enabled) and writes its spec,
// the groups, into dir as a Prometheus rule file; it returns the file and the alerts in it.
func chartRuleFile(t *testing.T, dir string) (string, []string) {
	t.Helper()
	version, err := kube.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, "helm"), "template", release, filepath.Join(repoRoot, "deployments", "helm", "vgpu-dra"),
		"--namespace", pluginNS, "--kube-version", version.GitVersion, "--show-only", "templates/prometheusrule.yaml", "--set", "prometheusRule.enabled=true")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template the PrometheusRule: %v (%s)", err, stderrOf(err))
	}
	var rule struct {
		Kind string `json:"kind"`
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert string `json:"alert"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	var spec struct {
		Spec any `json:"spec"`
	}
	if err := yaml.Unmarshal(out, &rule); err != nil || rule.Kind != "PrometheusRule" {
		t.Fatalf("the rendered PrometheusRule (%v):\n%s", err, out)
	}
	if err := yaml.Unmarshal(out, &spec); err != nil {
		t.Fatal(err)
	}
	var alerts []string
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				alerts = append(alerts, r.Alert)
			}
		}
	}
	body, err := yaml.Marshal(spec.Spec)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "alerts.yaml")
	if err := os.WriteFile(file, body, 0o644); err != nil {
		t.Fatal(err)
	}
	return file, alerts
}

// promScrapeConfig is the scrape a user points at the chart's pods (README, Monitoring): the
// pods of the release's namespace with a container port named `metrics` (the kubelet plugin's
// DaemonSet, the webhook's Deployment, the device plugin's), over HTTPS without verifying the
// self-signed certificate, with a bearer token allowed to get /metrics. Debian's Prometheus is
// built without Kubernetes discovery, so the test discovers the pods as kubernetes_sd_configs
// (role pod) with a keep on that port name would, and hands them over in a file (file_sd_configs),
// each labelled with its pod's component. It returns the scrape config and how many targets of
// each component it lists.
func promScrapeConfig(t *testing.T, dir, tokenFile string) (string, map[string]int) {
	t.Helper()
	pods, err := kube.CoreV1().Pods(pluginNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	type group struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	var groups []group
	listed := map[string]int{}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil || p.Status.PodIP == "" {
			continue
		}
		for _, c := range p.Spec.Containers {
			for _, port := range c.Ports {
				if port.Name == "metrics" {
					groups = append(groups, group{Targets: []string{net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(port.ContainerPort)))},
						Labels: map[string]string{"component": p.Labels["app.kubernetes.io/component"]}})
					listed[p.Labels["app.kubernetes.io/component"]]++
				}
			}
		}
	}
	body, err := json.Marshal(groups)
	if err != nil {
		t.Fatal(err)
	}
	targetsFile := filepath.Join(dir, "targets.json")
	if err := os.WriteFile(targetsFile, body, 0o644); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`  - job_name: vgpu-dra
    scheme: https
    tls_config: {insecure_skip_verify: true}
    authorization: {credentials_file: %q}
    file_sd_configs:
      - files: [%q]
`, tokenFile, targetsFile), listed
}

// promTarget is one of Prometheus's active targets.
type promTarget struct {
	Labels    map[string]string `json:"labels"`
	Health    string            `json:"health"`
	LastError string            `json:"lastError"`
}

func (p *prometheus) targets() ([]promTarget, error) {
	var r struct {
		Data struct {
			ActiveTargets []promTarget `json:"activeTargets"`
		} `json:"data"`
	}
	err := p.get("/api/v1/targets", &r)
	return r.Data.ActiveTargets, err
}

// scrapesAll: every target listed is up, and they are the plugin and the webhook's replicas.
func scrapesAll(targets []promTarget, listed map[string]int) (bool, error) {
	if listed["kubelet-plugin"] != 1 || listed["webhook"] == 0 {
		return false, fmt.Errorf("pods with a metrics port by component %v, want 1 kubelet-plugin and a webhook", listed)
	}
	up := map[string]int{}
	for _, tg := range targets {
		if tg.Health != "up" {
			return false, fmt.Errorf("target %v is %s: %s", tg.Labels, tg.Health, tg.LastError)
		}
		up[tg.Labels["component"]]++
	}
	return maps.Equal(up, listed), fmt.Errorf("targets up by component %v, listed %v", up, listed)
}

// promSample is one series of an instant query's answer.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// query runs expr as an instant query now.
func (p *prometheus) query(expr string) ([]promSample, error) {
	var r struct {
		Data struct {
			ResultType string       `json:"resultType"`
			Result     []promSample `json:"result"`
		} `json:"data"`
	}
	if err := p.get("/api/v1/query?query="+url.QueryEscape(expr), &r); err != nil {
		return nil, err
	}
	if r.Data.ResultType != "vector" {
		return nil, fmt.Errorf("%s: a %s, not a vector", expr, r.Data.ResultType)
	}
	return r.Data.Result, nil
}

// withData are the samples that a panel draws: NaN (a histogram_quantile of no observations, a
// division by 0) draws nothing.
func withData(samples []promSample) []promSample {
	var out []promSample
	for _, s := range samples {
		if v, ok := s.Value[1].(string); ok && v != "NaN" {
			out = append(out, s)
		}
	}
	return out
}

// promRuleCount is how many alerting rules Prometheus loaded.
func (p *prometheus) alertingRules() ([]string, error) {
	var r struct {
		Data struct {
			Groups []struct {
				Rules []struct{ Name, Type string } `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := p.get("/api/v1/rules", &r); err != nil {
		return nil, err
	}
	var names []string
	for _, g := range r.Data.Groups {
		for _, rule := range g.Rules {
			if rule.Type == "alerting" {
				names = append(names, rule.Name)
			}
		}
	}
	return names, nil
}

// wantAlert is an alert of the chart that the test provokes, and labels its firing instance
// carries.
type wantAlert struct {
	name   string
	labels map[string]string
}

func (w wantAlert) matches(a promAlert) bool {
	if a.Labels["alertname"] != w.name {
		return false
	}
	for k, v := range w.labels {
		if a.Labels[k] != v {
			return false
		}
	}
	return true
}

// notProvoked are the chart's alerts the local cluster does not provoke, and why; the test
// checks that they stay inactive.
var notProvoked = map[string]string{
	"VGPUNRIDisconnected": "NRI must stay lost for longer than nri.failureGrace (3m by default) after a good session: containerd without NRI for minutes, " +
		"while liveness restarts the plugin, and max_over_time keeps the alert 5 more minutes; hack/cluster-restart-containerd.sh reconnects within seconds, under the grace",
	"VGPURegistryBusy": "its `for: 5m` of BUSY answers more than once every 10 s needs a five-minute flood of connections over the registry's bounds",
}

// waitAlertsFiring waits until every wanted alert fires (each once, with its labels), failing at
// once on an alert that is pending or firing and is not one of them (except allowed).
func (p *prometheus) waitAlertsFiring(t *testing.T, timeout time.Duration, want []wantAlert, allowed func(promAlert) bool) []promAlert {
	t.Helper()
	var got []promAlert
	eventually(t, timeout, "the provoked alerts firing", func() (bool, error) {
		alerts, err := p.alerts()
		if err != nil {
			return false, err
		}
		got = got[:0]
		fired := make([]bool, len(want))
		var missing []string
		for _, a := range alerts {
			i := slices.IndexFunc(want, func(w wantAlert) bool { return w.matches(a) })
			switch {
			case i >= 0 && a.State == "firing":
				fired[i] = true
				got = append(got, a)
			case i < 0 && !allowed(a):
				t.Fatalf("alert %v is %s, and nothing provoked it: %+v", a.Labels, a.State, a)
			}
		}
		for i, w := range want {
			if !fired[i] {
				missing = append(missing, w.name)
			}
		}
		return len(missing) == 0, fmt.Errorf("not firing: %v; alerts %+v", missing, alerts)
	})
	return got
}

// firing tells whether an instance of the alert with these labels fires now.
func (p *prometheus) firing(t *testing.T, w wantAlert) bool {
	t.Helper()
	alerts, err := p.alerts()
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(alerts, func(a promAlert) bool { return w.matches(a) && a.State == "firing" })
}

// waitAlertGone waits until no instance of the alert with these labels is pending or firing.
func (p *prometheus) waitAlertGone(t *testing.T, timeout time.Duration, w wantAlert) {
	t.Helper()
	eventually(t, timeout, w.name+" resolved", func() (bool, error) {
		alerts, err := p.alerts()
		if err != nil {
			return false, err
		}
		for _, a := range alerts {
			if w.matches(a) {
				return false, fmt.Errorf("still %s: %+v", a.State, a)
			}
		}
		return true, nil
	})
}

// dashboardQuery is one query of one panel of the chart's Grafana dashboard.
type dashboardQuery struct {
	panel, expr string
}

// dashboardQueries are the dashboard's queries with Grafana's variables expanded as a user
// with every instance selected sees them: $instance (and any other variable) to `.*`, the
// interval variables to 1m.
func dashboardQueries(t *testing.T) []dashboardQuery {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "deployments", "helm", "vgpu-dra", "files", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string                  `json:"title"`
		Targets []struct{ Expr string } `json:"targets"`
		Panels  []json.RawMessage       `json:"panels"`
	}
	var d struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	intervals := regexp.MustCompile(`\$(__rate_interval|__interval|__range)\b|\$\{(__rate_interval|__interval|__range)\}`)
	variables := regexp.MustCompile(`\$\{\w+(:\w+)?\}|\$\w+`)
	var out []dashboardQuery
	var walk func([]json.RawMessage)
	walk = func(ps []json.RawMessage) {
		for _, r := range ps {
			var p panel
			if err := json.Unmarshal(r, &p); err != nil {
				t.Fatal(err)
			}
			walk(p.Panels)
			for _, tg := range p.Targets {
				if tg.Expr != "" {
					expr := variables.ReplaceAllString(intervals.ReplaceAllString(tg.Expr, "1m"), ".*")
					out = append(out, dashboardQuery{panel: p.Title, expr: expr})
				}
			}
		}
	}
	walk(d.Panels)
	return out
}

// noDataHere are the dashboard's queries that cannot have data on the local cluster, by panel
// and metric, and why. The test fails if one of them does have data (the entry is stale).
var noDataHere = map[dashboardQuery]string{
	{panel: "Memory used and limit", expr: "vgpu_dra_container_memory_nvml_bytes"}: "NVML's per-process used memory is unknown on simulated GPUs (contract §8): the series is absent there",
}

// noDataReason is why q may have no data here, or "".
func noDataReason(q dashboardQuery) string {
	for k, why := range noDataHere {
		if k.panel == q.panel && strings.Contains(q.expr, k.expr) {
			return why
		}
	}
	return ""
}
