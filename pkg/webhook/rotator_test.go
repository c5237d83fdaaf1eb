package webhook

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2/ktesting"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// TestSelfManagedTLSReadsOnlyItsSecret: the rotator's cache and the Secret mirror list and watch
// Secrets only with the field selector on the webhook's Secret, the one form of list and watch
// that the chart's Role (resourceNames) allows; the API server plays that Role and refuses the
// rest, as RBAC would.
func TestSelfManagedTLSReadsOnlyItsSecret(t *testing.T) {
	logger, ctx := ktesting.NewTestContext(t)
	ctrllog.SetLogger(logger)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	secret := fmt.Sprintf("webhook-tls-%d", rotatorTests.Add(1)) // one rotator per Secret and process
	api := newRBACAPIServer(t, "vgpu", secret)
	cfg := RotatorConfig{SecretNamespace: "vgpu", SecretName: secret, DNSName: testDNSName,
		MutatingConfiguration: "webhook", ValidatingConfiguration: "webhook"}
	rc := &rest.Config{Host: api.URL, UserAgent: "rotator"}
	mirrorConfig := rest.CopyConfig(rc)
	mirrorConfig.UserAgent = "mirror"
	kube := kubernetes.NewForConfigOrDie(mirrorConfig)

	s, err := newSelfManagedTLS(cfg, rc, kube, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s.start(ctx)
	eventually(t, "the rotator and the mirror list or watch Secrets", func() error {
		if seen := api.readers(); !seen["rotator"] || !seen["mirror"] {
			return fmt.Errorf("Secrets read by %v", seen)
		}
		return nil
	})
	if refused := api.refusedRequests(); len(refused) > 0 {
		t.Errorf("requests for Secrets that the Role does not allow: %v", refused)
	}
}

var rotatorTests atomic.Int32

// rbacAPIServer is just enough of an API server for the rotator's manager: discovery of Secrets
// and the webhook configurations, empty lists, and watches that stay open. A list or watch of
// the namespace's Secrets without the field selector on the allowed name is refused (403).
type rbacAPIServer struct {
	*httptest.Server
	collection, selector string

	mu      sync.Mutex
	refused []string
	readBy  map[string]bool // the user agents that listed or watched Secrets
}

func newRBACAPIServer(t *testing.T, namespace, name string) *rbacAPIServer {
	s := &rbacAPIServer{collection: "/api/v1/namespaces/" + namespace + "/secrets", selector: "metadata.name=" + name,
		readBy: map[string]bool{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

func (s *rbacAPIServer) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	q := r.URL.Query()
	switch {
	case r.URL.Path == s.collection:
		s.mu.Lock()
		s.readBy[strings.SplitN(r.UserAgent(), " ", 2)[0]] = true
		if q.Get("fieldSelector") != s.selector {
			s.refused = append(s.refused, r.Method+" "+r.URL.String())
			s.mu.Unlock()
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403}`)
			return
		}
		s.mu.Unlock()
		list(w, r, "SecretList", "v1")
	case strings.HasPrefix(r.URL.Path, "/apis/admissionregistration.k8s.io/v1/"):
		list(w, r, "List", "admissionregistration.k8s.io/v1")
	case r.URL.Path == "/api":
		fmt.Fprint(w, `{"kind":"APIVersions","versions":["v1"]}`)
	case r.URL.Path == "/apis":
		fmt.Fprint(w, `{"kind":"APIGroupList","apiVersion":"v1","groups":[{"name":"admissionregistration.k8s.io",`+
			`"versions":[{"groupVersion":"admissionregistration.k8s.io/v1","version":"v1"}],`+
			`"preferredVersion":{"groupVersion":"admissionregistration.k8s.io/v1","version":"v1"}}]}`)
	case r.URL.Path == "/api/v1":
		fmt.Fprint(w, `{"kind":"APIResourceList","groupVersion":"v1","resources":[`+
			`{"name":"secrets","singularName":"secret","namespaced":true,"kind":"Secret","verbs":["get","list","watch","update"]}]}`)
	case r.URL.Path == "/apis/admissionregistration.k8s.io/v1":
		fmt.Fprint(w, `{"kind":"APIResourceList","groupVersion":"admissionregistration.k8s.io/v1","resources":[`+
			`{"name":"mutatingwebhookconfigurations","singularName":"mutatingwebhookconfiguration","namespaced":false,"kind":"MutatingWebhookConfiguration","verbs":["get","list","watch","update"]},`+
			`{"name":"validatingwebhookconfigurations","singularName":"validatingwebhookconfiguration","namespaced":false,"kind":"ValidatingWebhookConfiguration","verbs":["get","list","watch","update"]}]}`)
	default:
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
	}
}

// list answers a list with no items, a watch by staying open until the client leaves, and a
// streaming list (sendInitialEvents) with "not supported", which sends the client to list.
func list(w http.ResponseWriter, r *http.Request, kind, apiVersion string) {
	q := r.URL.Query()
	switch {
	case q.Get("sendInitialEvents") == "true":
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"BadRequest","code":400}`)
	case q.Get("watch") == "true" || q.Get("watch") == "1":
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	default:
		fmt.Fprintf(w, `{"kind":%q,"apiVersion":%q,"metadata":{"resourceVersion":"1"},"items":[]}`, kind, apiVersion)
	}
}

func (s *rbacAPIServer) readers() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]bool{}
	for k, v := range s.readBy {
		out[k] = v
	}
	return out
}

func (s *rbacAPIServer) refusedRequests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.refused...)
}

// TestOnlyTheSecretRefusesAnotherSelector: a list of Secrets that names another field selector
// is refused on the client, never widened or silently answered with the webhook's Secret.
func TestOnlyTheSecretRefusesAnotherSelector(t *testing.T) {
	rt := onlyTheSecret("vgpu", "webhook-tls")(roundTripperFunc(func(*http.Request) (*http.Response, error) {
		t.Fatal("the request reached the API server")
		return nil, nil
	}))
	req := httptest.NewRequest(http.MethodGet, "https://api/api/v1/namespaces/vgpu/secrets?fieldSelector=metadata.name%3Dother", nil)
	if _, err := rt.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "only Secret webhook-tls") {
		t.Errorf("RoundTrip = %v, want a refusal naming the Secret", err)
	}
}
