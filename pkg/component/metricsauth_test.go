package component

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2/ktesting"
)

// Tokens of the tests: the reader's user may get /metrics, the stranger's may not.
const (
	readerToken   = "reader-token"
	strangerToken = "stranger-token"
	readerUser    = "system:serviceaccount:monitoring:prometheus"
	strangerUser  = "system:serviceaccount:tenant:default"
)

// TestMetricsAuth: guarded, /metrics answers over HTTPS 401 without a token or with one the
// authenticator does not know, 403 to a user the authorizer does not allow to get the
// non-resource URL /metrics, and the metrics to one it allows; open (nil access) it answers
// anyone over plain HTTP.
func TestMetricsAuth(t *testing.T) {
	users := map[string]string{readerToken: readerUser, strangerToken: strangerUser}
	access := &MetricsAccess{
		Authenticator: bearertoken.New(authenticator.TokenFunc(func(_ context.Context, token string) (*authenticator.Response, bool, error) {
			if name, ok := users[token]; ok {
				return &authenticator.Response{User: &user.DefaultInfo{Name: name}}, true, nil
			}
			return nil, false, nil
		})),
		Authorizer: authorizer.AuthorizerFunc(func(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
			if a.GetUser().GetName() == readerUser && a.GetVerb() == "get" && a.GetPath() == MetricsPath && !a.IsResourceRequest() {
				return authorizer.DecisionAllow, "", nil
			}
			return authorizer.DecisionNoOpinion, "", nil
		}),
	}
	checkMetricsAuth(t, access)

	addr := serveTestMetrics(t, nil)
	if code, body := scrape(t, "http://"+addr.String(), ""); code != http.StatusOK || !strings.Contains(body, "vgpu_dra_test_total 1") {
		t.Errorf("--metrics-auth=none without a token: %d, want 200 with the metrics:\n%s", code, body)
	}
}

// TestDelegatedMetricsAccess: the delegated guard asks the API server a TokenReview of the
// request's token and a SubjectAccessReview of get on the non-resource URL /metrics for the
// user that review names, and answers as they say.
func TestDelegatedMetricsAccess(t *testing.T) {
	var mu sync.Mutex
	var asked []authorizationv1.SubjectAccessReviewSpec
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/apis/authentication.k8s.io/v1/tokenreviews":
			var review authenticationv1.TokenReview
			mustDecode(t, r, &review)
			if name, ok := map[string]string{readerToken: readerUser, strangerToken: strangerUser}[review.Spec.Token]; ok {
				review.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: name}}
			}
			_ = json.NewEncoder(w).Encode(&review)
		case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
			var review authorizationv1.SubjectAccessReview
			mustDecode(t, r, &review)
			mu.Lock()
			asked = append(asked, review.Spec)
			mu.Unlock()
			nra := review.Spec.NonResourceAttributes
			review.Status.Allowed = review.Spec.User == readerUser && nra != nil && nra.Path == MetricsPath && nra.Verb == "get"
			_ = json.NewEncoder(w).Encode(&review)
		default:
			http.NotFound(w, r)
		}
	}))
	defer api.Close()
	access, err := NewDelegatedMetricsAccess(kubernetes.NewForConfigOrDie(&rest.Config{Host: api.URL}))
	if err != nil {
		t.Fatal(err)
	}
	checkMetricsAuth(t, access)
	mu.Lock()
	defer mu.Unlock()
	if len(asked) == 0 {
		t.Error("no SubjectAccessReview was asked")
	}
	for _, spec := range asked {
		if spec.ResourceAttributes != nil || spec.NonResourceAttributes == nil {
			t.Errorf("SubjectAccessReview %+v, want one for the non-resource URL %s", spec, MetricsPath)
		}
	}
}

func mustDecode(t *testing.T, r *http.Request, into any) {
	if err := json.NewDecoder(r.Body).Decode(into); err != nil {
		t.Errorf("decode %s: %v", r.URL.Path, err)
	}
}

// checkMetricsAuth scrapes an endpoint guarded by access with each kind of caller.
func checkMetricsAuth(t *testing.T, access *MetricsAccess) {
	t.Helper()
	url := "https://" + serveTestMetrics(t, access).String()
	for _, tc := range []struct {
		caller, token string
		want          int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"an unknown token", "made-up", http.StatusUnauthorized},
		{"a user without access", strangerToken, http.StatusForbidden},
		{"a user allowed to get /metrics", readerToken, http.StatusOK},
	} {
		code, body := scrape(t, url, tc.token)
		if code != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.caller, code, body, tc.want)
		}
		if has := strings.Contains(body, "vgpu_dra_test_total 1"); has != (tc.want == http.StatusOK) {
			t.Errorf("%s: the metrics were served: %v, want %v", tc.caller, has, tc.want == http.StatusOK)
		}
	}
	if code, _ := scrape(t, strings.Replace(url, "https://", "http://", 1), readerToken); code == http.StatusOK {
		t.Error("the guarded endpoint answered plain HTTP")
	}
}

// serveTestMetrics serves a registry with one metric of its own until the test ends.
func serveTestMetrics(t *testing.T, access *MetricsAccess) net.Addr {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	reg := NewMetricsRegistry()
	own := metrics.NewCounter(&metrics.CounterOpts{Namespace: "vgpu_dra", Name: "test_total", Help: "test", StabilityLevel: metrics.ALPHA})
	reg.MustRegister(own)
	own.Inc()
	addr, err := ServeMetrics(ctx, "127.0.0.1:0", reg, access)
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// scrape GETs base/metrics as Prometheus does with a bearer token, skipping the verification of
// the self-signed certificate.
func scrape(t *testing.T, base, token string) (int, string) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, base+MetricsPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", req.URL, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
