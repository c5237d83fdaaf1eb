package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// RotatorConfig is the self-managed TLS mode: cert-controller's rotator keeps a CA and a
// serving certificate in a Secret, renews them before they expire, and writes the CA into the
// webhook configurations' caBundle; the webhook copies the Secret's certificate into its
// certificate directory the moment it changes.
type RotatorConfig struct {
	// SecretNamespace and SecretName name the Secret (it must exist; the chart creates it empty).
	SecretNamespace, SecretName string
	// DNSName is the name the serving certificate is issued for: "<service>.<namespace>.svc".
	DNSName string
	// MutatingConfiguration and ValidatingConfiguration are the webhook configurations whose
	// caBundle the rotator keeps.
	MutatingConfiguration, ValidatingConfiguration string
}

// Names in the rotator's certificates.
const (
	rotatorCAName         = "vgpu-webhook-ca"
	rotatorCAOrganization = "vgpu-dra"
	rotatorFieldOwner     = "vgpu-webhook"
)

// selfManagedTLS runs cert-controller's rotator and the Secret mirror.
type selfManagedTLS struct {
	cfg     RotatorConfig
	mgr     manager.Manager
	ready   chan struct{} // closed by the rotator once the files exist and the CA is injected
	mirror  *secretMirror
	secrets informers.SharedInformerFactory
}

// newSelfManagedTLS builds the rotator on a controller-runtime manager of its own (no metrics,
// probes or leader election: every replica rotates, and the API server's optimistic
// concurrency makes one of two concurrent rotations win) and the informer on the one Secret.
// Both list and watch that Secret alone (a field selector on its name), which is all the
// chart's Role lets the webhook read.
func newSelfManagedTLS(cfg RotatorConfig, rc *rest.Config, kube kubernetes.Interface, certDir string) (*selfManagedTLS, error) {
	rc = rest.CopyConfig(rc)
	rc.Wrap(onlyTheSecret(cfg.SecretNamespace, cfg.SecretName))
	mgr, err := manager.New(rc, manager.Options{
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		return nil, fmt.Errorf("create the certificate rotator's manager: %w", err)
	}
	s := &selfManagedTLS{cfg: cfg, mgr: mgr, ready: make(chan struct{}), mirror: &secretMirror{dir: certDir}}
	err = rotator.AddRotator(mgr, &rotator.CertRotator{
		SecretKey:      types.NamespacedName{Namespace: cfg.SecretNamespace, Name: cfg.SecretName},
		CertDir:        certDir,
		CAName:         rotatorCAName,
		CAOrganization: rotatorCAOrganization,
		DNSName:        cfg.DNSName,
		IsReady:        s.ready,
		Webhooks: []rotator.WebhookInfo{
			{Name: cfg.MutatingConfiguration, Type: rotator.Mutating},
			{Name: cfg.ValidatingConfiguration, Type: rotator.Validating},
		},
		FieldOwner:   rotatorFieldOwner,
		ExtKeyUsages: &[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		// controller-runtime refuses two controllers of one name in a process: named after
		// its Secret, a rotator per Secret can run side by side (tests).
		ControllerName: "cert-rotator-" + cfg.SecretNamespace + "-" + cfg.SecretName,
	})
	if err != nil {
		return nil, fmt.Errorf("add the certificate rotator: %w", err)
	}
	// Only this Secret: list and watch with a name field selector.
	s.secrets = informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithNamespace(cfg.SecretNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", cfg.SecretName).String()
		}))
	sync := func(obj any) {
		if secret, ok := obj.(*corev1.Secret); ok {
			s.mirror.sync(secret)
		}
	}
	if _, err := s.secrets.Core().V1().Secrets().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: sync, UpdateFunc: func(_, obj any) { sync(obj) },
	}); err != nil {
		return nil, fmt.Errorf("watch the certificate Secret: %w", err)
	}
	return s, nil
}

// start runs the Secret mirror and then the rotator until ctx ends. A rotator that cannot
// start (no Secret, no access) is reported on the returned channel: the process must stop.
func (s *selfManagedTLS) start(ctx context.Context) <-chan error {
	s.mirror.logger = klog.FromContext(ctx).WithName("tls")
	s.secrets.Start(ctx.Done())
	errs := make(chan error, 1)
	go func() {
		if err := s.mgr.Start(ctx); err != nil {
			errs <- fmt.Errorf("certificate rotator for Secret %s/%s: %w", s.cfg.SecretNamespace, s.cfg.SecretName, err)
		}
	}()
	return errs
}

// Check is the readiness check of the self-managed mode: the rotator has the certificate in
// place and its CA in both webhook configurations.
func (s *selfManagedTLS) Check(context.Context) error {
	select {
	case <-s.ready:
		return nil
	default:
		return fmt.Errorf("the certificate rotator has not yet written Secret %s/%s and injected its CA into %s and %s",
			s.cfg.SecretNamespace, s.cfg.SecretName, s.cfg.MutatingConfiguration, s.cfg.ValidatingConfiguration)
	}
}

// secretMirror copies a kubernetes.io/tls Secret's certificate and key into a directory. The
// kubelet would do the same for a mounted Secret, but only at its next sync of the pod (about a
// minute): a fresh install would stay unready that long, and a rotated CA would be served late.
type secretMirror struct {
	dir    string
	logger klog.Logger

	mu         sync.Mutex
	cert, key  []byte
	lastReport string
}

// sync writes the Secret's pair unless it is unchanged or not a valid pair yet (the rotator
// fills an empty Secret after start-up).
func (m *secretMirror) sync(secret *corev1.Secret) {
	m.mu.Lock()
	defer m.mu.Unlock()
	logger := m.logger
	cert, key := secret.Data[CertFile], secret.Data[KeyFile]
	if bytes.Equal(cert, m.cert) && bytes.Equal(key, m.key) {
		return
	}
	report := func(msg string, err error) {
		if msg+fmt.Sprint(err) != m.lastReport {
			logger.Info(msg, "secret", klog.KObj(secret), "err", err)
			m.lastReport = msg + fmt.Sprint(err)
		}
	}
	if _, err := tls.X509KeyPair(cert, key); err != nil {
		report("The certificate Secret holds no valid pair yet", err)
		return
	}
	if err := os.MkdirAll(m.dir, 0o700); err != nil {
		report("Cannot create the certificate directory", err)
		return
	}
	if err := writeCertDir(m.dir, cert, key); err != nil {
		report("Cannot write the serving certificate", errors.Join(err, fmt.Errorf("in %s", filepath.Clean(m.dir))))
		return
	}
	m.cert, m.key = cert, key
	logger.Info("Wrote the serving certificate from its Secret", "secret", klog.KObj(secret), "resourceVersion", secret.ResourceVersion)
}

// onlyTheSecret narrows every list and watch of the Secrets of namespace to the one named name.
// cert-controller's rotator reads its Secret through a controller-runtime cache of every Secret
// of the namespace, with no option to narrow it, and RBAC can restrict a list or a watch by
// resourceNames only when the request carries the field selector metadata.name=<name>: without
// it the webhook would need to read every Secret of its namespace. The rotator never reads
// another Secret (its reconciler ignores every other name), so the narrowed cache is all it uses.
func onlyTheSecret(namespace, name string) func(http.RoundTripper) http.RoundTripper {
	collection := "/api/v1/namespaces/" + namespace + "/secrets"
	selector := fields.OneTermEqualSelector("metadata.name", name).String()
	return func(next http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, collection) {
				return next.RoundTrip(req)
			}
			q := req.URL.Query()
			if q.Get("fieldSelector") != "" && q.Get("fieldSelector") != selector {
				return nil, fmt.Errorf("list Secrets of %s with field selector %q: only Secret %s may be read", namespace, q.Get("fieldSelector"), name)
			}
			q.Set("fieldSelector", selector)
			req = req.Clone(req.Context())
			req.URL.RawQuery = q.Encode()
			return next.RoundTrip(req)
		})
	}
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }
