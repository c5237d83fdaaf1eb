package component

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net/http"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// MetricsAuth says who may read /metrics (--metrics-auth, contract §8).
type MetricsAuth string

const (
	// MetricsAuthDelegated (the default) serves /metrics over HTTPS and only to a request whose
	// bearer token the API server authenticates (TokenReview) and whose user it allows to get
	// the non-resource URL /metrics (SubjectAccessReview), as Kubernetes' own components do.
	MetricsAuthDelegated MetricsAuth = "delegated"
	// MetricsAuthNone serves /metrics to anyone over plain HTTP.
	MetricsAuthNone MetricsAuth = "none"
)

// MetricsPath is the endpoint's path, and the non-resource URL a reader must be allowed to get.
const MetricsPath = "/metrics"

// How long the API server's answers are kept (the kubelet's defaults for its own endpoints): a
// Prometheus scraping every 15 s costs a TokenReview every 2 minutes and a SubjectAccessReview
// every 5; a refusal is asked again after 30 s.
const (
	metricsTokenCacheTTL  = 2 * time.Minute
	metricsAllowCacheTTL  = 5 * time.Minute
	metricsDenyCacheTTL   = 30 * time.Second
	metricsReviewTimeout  = 10 * time.Second
	metricsCertificateFor = "localhost"
)

// metricsReviewBackoff bounds the retries of one review (about 2 s in all), so that an API
// server in trouble costs a scrape a refusal, not a hang.
var metricsReviewBackoff = wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 4}

// MetricsAccess guards /metrics: who is asking (Authenticator) and whether they may get it
// (Authorizer). A nil *MetricsAccess serves it to anyone.
type MetricsAccess struct {
	Authenticator authenticator.Request
	Authorizer    authorizer.Authorizer
}

// NewDelegatedMetricsAccess asks the API server through kube: a TokenReview for the bearer
// token, a SubjectAccessReview for get on /metrics, each answer cached. kube should be a client
// of its own: requests with made-up tokens, which no cache answers, then spend its client-side
// rate limit, not that of the binary's own API calls.
func NewDelegatedMetricsAccess(kube kubernetes.Interface) (*MetricsAccess, error) {
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		TokenAccessReviewClient:  kube.AuthenticationV1(),
		TokenAccessReviewTimeout: metricsReviewTimeout,
		WebhookRetryBackoff:      &metricsReviewBackoff,
		CacheTTL:                 metricsTokenCacheTTL,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("delegated authentication of /metrics: %w", err)
	}
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: kube.AuthorizationV1(),
		AllowCacheTTL:             metricsAllowCacheTTL,
		DenyCacheTTL:              metricsDenyCacheTTL,
		WebhookRetryBackoff:       &metricsReviewBackoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("delegated authorization of /metrics: %w", err)
	}
	return &MetricsAccess{Authenticator: authn, Authorizer: authz}, nil
}

// guard lets through a GET of a user allowed to get MetricsPath: 401 without a valid token,
// 403 for a user who may not, 405 for another method.
func (a *MetricsAccess) guard(logger klog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, "only GET", http.StatusMethodNotAllowed)
			return
		}
		resp, ok, err := a.Authenticator.AuthenticateRequest(r)
		if err != nil || !ok {
			logger.V(4).Info("Refused an unauthenticated metrics request", "remote", r.RemoteAddr, "err", err)
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		attrs := authorizer.AttributesRecord{User: resp.User, Verb: "get", Path: MetricsPath, ResourceRequest: false}
		decision, reason, err := a.Authorizer.Authorize(r.Context(), attrs)
		if decision != authorizer.DecisionAllow {
			logger.V(4).Info("Refused a metrics request", "user", resp.User.GetName(), "remote", r.RemoteAddr, "reason", reason, "err", err)
			if err != nil {
				http.Error(w, "could not check access to "+MetricsPath, http.StatusInternalServerError)
				return
			}
			http.Error(w, fmt.Sprintf("Forbidden: user %q may not get %s", resp.User.GetName(), MetricsPath), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// selfSignedCertificate is the guarded endpoint's serving certificate (ECDSA P-256, a year),
// made at start-up as Kubernetes' components make theirs without --tls-cert-file: scrapers skip
// its verification (Prometheus: tls_config.insecure_skip_verify) and rely on TLS to keep their
// token from anyone who can watch the pod network. ECDSA, not RSA: it costs the start-up
// (and a handover's successor) well under a millisecond.
func selfSignedCertificate(now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate the metrics endpoint's key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate the metrics endpoint's certificate serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: metricsCertificateFor + "@" + strconv.FormatInt(now.Unix(), 10)},
		DNSNames:     []string{metricsCertificateFor},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("sign the metrics endpoint's certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
