package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The ServiceAccount the suites scrape /metrics as, the way a Prometheus bound to the chart's
// <release>-metrics-reader does (metrics.auth delegated, the chart's default): InstallChartFor
// lists it in metrics.readers, and MetricsScraper creates it and mints its tokens.
const (
	MetricsScraperNS = "default"
	MetricsScraperSA = "vgpu-metrics-scraper"
	// MetricsReaders is the chart value that binds it (helm --set-json).
	MetricsReaders = `metrics.readers=[{"kind":"ServiceAccount","name":"` + MetricsScraperSA + `","namespace":"` + MetricsScraperNS + `"}]`
)

// metricsTokenLifetime is how long a minted token is valid; MetricsScraper mints a new one once
// half of it has passed.
const metricsTokenLifetime = time.Hour

// MetricsScraper GETs the binaries' /metrics as such a Prometheus: HTTPS without verifying the
// self-signed certificate, with the ServiceAccount's bearer token.
type MetricsScraper struct {
	c      *Cluster
	client *http.Client

	mu      sync.Mutex
	token   string
	expires time.Time
}

// MetricsScraper returns a scraper of the suite's ServiceAccount.
func (c *Cluster) MetricsScraper() *MetricsScraper {
	return &MetricsScraper{c: c, client: &http.Client{Timeout: 10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}}
}

// Token is a bearer token of the ServiceAccount valid for at least half an hour, created (with
// the ServiceAccount) when needed.
func (s *MetricsScraper) Token(ctx context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.token != "" && time.Until(s.expires) > metricsTokenLifetime/2 {
		return s.token, nil
	}
	sas := s.c.Kube.CoreV1().ServiceAccounts(MetricsScraperNS)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: MetricsScraperSA}}
	if _, err := sas.Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("create ServiceAccount %s/%s: %w", MetricsScraperNS, MetricsScraperSA, err)
	}
	seconds := int64(metricsTokenLifetime / time.Second)
	tr, err := sas.CreateToken(ctx, MetricsScraperSA, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token of ServiceAccount %s/%s: %w", MetricsScraperNS, MetricsScraperSA, err)
	}
	s.token, s.expires = tr.Status.Token, tr.Status.ExpirationTimestamp.Time
	return s.token, nil
}

// Get reads https://<hostPort>/metrics; any status but 200 is an error that names it.
func (s *MetricsScraper) Get(ctx context.Context, hostPort string) ([]byte, error) {
	token, err := s.Token(ctx)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+hostPort+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", req.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", req.URL, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s as %s/%s: %s: %s", req.URL, MetricsScraperNS, MetricsScraperSA, resp.Status, body)
	}
	return body, nil
}
