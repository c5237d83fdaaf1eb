package component

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/component-base/metrics"
)

// TestMetricsEndpointServesInstanceAndProcessMetrics: /metrics shows the binary's own metrics
// next to the Go runtime, the process and client-go's requests to the API server.
func TestMetricsEndpointServesInstanceAndProcessMetrics(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"major":"1","minor":"37","gitVersion":"v1.37.2"}`)
	}))
	defer api.Close()
	o := mustOptions(t, "--kubeconfig="+writeKubeconfig(t, api.URL))
	kube, err := o.KubeClient("node-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.Discovery().ServerVersion(); err != nil {
		t.Fatalf("request to the fake API server: %v", err)
	}

	reg := NewMetricsRegistry()
	own := metrics.NewCounter(&metrics.CounterOpts{Namespace: "vgpu_dra", Name: "test_total", Help: "test", StabilityLevel: metrics.ALPHA})
	reg.MustRegister(own)
	own.Inc()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, err := ServeMetrics(ctx, "127.0.0.1:0", reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{"vgpu_dra_test_total 1", "go_goroutines", "process_start_time_seconds", `rest_client_requests_total{code="200",host=`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestServeMetricsDisabled(t *testing.T) {
	if addr, err := ServeMetrics(context.Background(), "", NewMetricsRegistry(), nil); addr != nil || err != nil {
		t.Errorf("empty address: %v, %v; want nothing served and no error", addr, err)
	}
}

// TestOptions: defaults, the user agent names the binary and its instance, and Complete reports
// every bad value at once.
func TestOptions(t *testing.T) {
	o := mustOptions(t, "--kubeconfig="+writeKubeconfig(t, "https://127.0.0.1:1"), "--health-port=-1")
	if o.KubeAPIQPS != DefaultKubeAPIQPS || o.KubeAPIBurst != DefaultKubeAPIBurst || o.MetricsAddress != DefaultMetricsAddress || o.MetricsAuth != MetricsAuthDelegated {
		t.Errorf("defaults: qps %v burst %v metrics %q auth %q", o.KubeAPIQPS, o.KubeAPIBurst, o.MetricsAddress, o.MetricsAuth)
	}
	if o.HealthAddress() != "" {
		t.Errorf("--health-port=-1: HealthAddress %q, want disabled", o.HealthAddress())
	}
	rc, err := o.RESTConfig("node-1")
	if err != nil {
		t.Fatal(err)
	}
	if rc.UserAgent != "test-binary/node-1" || rc.QPS != DefaultKubeAPIQPS {
		t.Errorf("REST config: user agent %q qps %v", rc.UserAgent, rc.QPS)
	}

	bad, err := NewOptions("test-binary", 1)
	if err != nil {
		t.Fatal(err)
	}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	bad.AddFlags(fs)
	if err := fs.Parse([]string{"--kube-api-qps=0", "--kube-api-burst=-1", "--logging-format=xml", "--metrics-auth=open"}); err != nil {
		t.Fatal(err)
	}
	err = bad.Validate()
	if err == nil || !strings.Contains(err.Error(), "--kube-api-qps") || !strings.Contains(err.Error(), "xml") || !strings.Contains(err.Error(), "--metrics-auth=open") {
		t.Errorf("Validate = %v, want the rate limit, the logging format and the metrics auth problem", err)
	}
}

func mustOptions(t *testing.T, args ...string) *Options {
	t.Helper()
	o, err := NewOptions("test-binary", 1)
	if err != nil {
		t.Fatal(err)
	}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err != nil { // Complete applies logging, once per process
		t.Fatal(err)
	}
	return o
}

func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+server+`"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestParseAndComplete: --help is not an error and runs nothing; an unknown flag and a bad value
// are errors that name them. (A good set is left to the commands' tests: Complete applies the
// logging configuration, once per process.)
func TestParseAndComplete(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		help     bool
		contains string
	}{
		{args: []string{"--help"}, help: true},
		{args: []string{"--no-such-flag"}, contains: "no-such-flag"},
		{args: []string{"--kube-api-qps=0"}, contains: "--kube-api-qps"},
	} {
		o, err := NewOptions("test-binary", 1)
		if err != nil {
			t.Fatal(err)
		}
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o.AddFlags(fs)
		help, err := o.ParseAndComplete(fs, tc.args)
		if help != tc.help {
			t.Errorf("%v: help = %v, want %v", tc.args, help, tc.help)
		}
		if tc.contains == "" && err != nil || tc.contains != "" && (err == nil || !strings.Contains(err.Error(), tc.contains)) {
			t.Errorf("%v: error %v, want one naming %q", tc.args, err, tc.contains)
		}
	}
}
