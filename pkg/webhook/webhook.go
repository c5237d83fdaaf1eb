package webhook

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/vgpu-dra/vgpu-dra/pkg/component"
	"github.com/vgpu-dra/vgpu-dra/pkg/health"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// Defaults of the webhook's durations.
const (
	// DefaultMissingClaimWait covers the watch lag between a claim and the pod created right
	// after it, well under the chart's timeoutSeconds (5 s).
	DefaultMissingClaimWait = 2 * time.Second
	// DefaultShutdownDelay covers the endpoints controller and kube-proxy withdrawing the pod
	// (about a second on a quiet cluster), well under the pod's termination grace period.
	DefaultShutdownDelay = 5 * time.Second
	// DefaultMaxMissingClaimWaits bounds the reviews that wait for a missing claim at once: far
	// above what kubectl apply of a claim with its pods needs (each wait ends milliseconds after
	// the claim is created), far below what would tie up the webhook's goroutines and
	// connections (each wait can hold one for MissingClaimWait).
	DefaultMaxMissingClaimWaits = 32
)

// Config is vgpu-webhook's configuration; cmd/vgpu-webhook fills it from flags.
type Config struct {
	Rules Rules
	// Address is where the API server sends admission reviews (":8443").
	Address string
	// CertDir holds tls.crt and tls.key, reloaded when they change.
	CertDir string
	// Rotator selects the self-managed TLS mode (cert-controller's rotator keeps the certificate
	// in a Secret, which the webhook copies into CertDir); nil: someone else keeps CertDir
	// (cert-manager's Secret, mounted by the kubelet).
	Rotator *RotatorConfig
	// MissingClaimWait bounds how long a review waits for a claim or template that its cache has
	// not seen (it must stay well under the webhook configurations' timeoutSeconds).
	MissingClaimWait time.Duration
	// MaxMissingClaimWaits bounds how many lookups wait at once; beyond it a lookup answers at
	// once, as if its wait had ended. 0: DefaultMaxMissingClaimWaits.
	MaxMissingClaimWaits int
	// ShutdownDelay is how long the server keeps answering, unready, after it is told to stop:
	// the time the endpoints controller and kube-proxy need to stop sending it reviews.
	ShutdownDelay time.Duration
	// HealthAddress serves grpc.health.v1 ("liveness", "readiness"); empty disables it.
	HealthAddress string
	// MetricsAddress serves /metrics; empty disables it.
	MetricsAddress string
}

// Validate reports every problem of the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if len(c.Rules.DeviceClasses) == 0 || slices.Contains(c.Rules.DeviceClasses, "") {
		errs = append(errs, errors.New("--device-class must name at least one DeviceClass, and no empty one"))
	}
	if c.Rules.UUIDAttribute == "" {
		errs = append(errs, errors.New("--driver-name must not be empty"))
	}
	if c.Address == "" || c.CertDir == "" {
		errs = append(errs, errors.New("--webhook-address and --cert-dir must not be empty"))
	}
	if c.MissingClaimWait < 0 || c.ShutdownDelay < 0 || c.MaxMissingClaimWaits < 0 {
		errs = append(errs, errors.New("--missing-claim-wait, --max-missing-claim-waits and --shutdown-delay must not be negative"))
	}
	if r := c.Rotator; r != nil && (r.SecretNamespace == "" || r.SecretName == "" || r.DNSName == "" ||
		r.MutatingConfiguration == "" || r.ValidatingConfiguration == "") {
		errs = append(errs, errors.New("the self-managed TLS mode needs --tls-secret as <namespace>/<name>, --tls-dns-name, "+
			"--mutating-webhook-configuration and --validating-webhook-configuration"))
	}
	return errors.Join(errs...)
}

// Deps are what the webhook takes from outside.
type Deps struct {
	KubeClient kubernetes.Interface
	// RESTConfig builds the rotator's client; needed only in the self-managed TLS mode.
	RESTConfig *rest.Config
	// MetricsAccess guards /metrics (component.Options.MetricsAccess, --metrics-auth); nil
	// serves it to anyone over plain HTTP.
	MetricsAccess *component.MetricsAccess
}

// Webhook is a running vgpu-webhook.
type Webhook struct {
	// Addr is the bound address of the admission server; HealthAddr and MetricsAddr those of
	// the health and metrics servers (nil when disabled).
	Addr, HealthAddr, MetricsAddr net.Addr

	health  *health.Server
	drainer drainer
	done    chan struct{}
	err     error
}

// Start builds the webhook in order (informers, certificate, admission server, health and
// metrics) and serves until ctx ends; then it turns unready, keeps answering for ShutdownDelay
// and until reviews stop coming, closing each connection after its answer (drainer), and stops. A certificate rotator that fails stops it at once with that error (Wait).
func Start(ctx context.Context, cfg Config, deps Deps) (*Webhook, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	// certwatcher and cert-controller log through controller-runtime's logger, which names
	// itself "controller-runtime".
	ctrllog.SetLogger(logger)

	factory := informers.NewSharedInformerFactory(deps.KubeClient, 0)
	specs, err := NewCacheSpecs(factory, cfg.MissingClaimWait, cmp.Or(cfg.MaxMissingClaimWaits, DefaultMaxMissingClaimWaits))
	if err != nil {
		return nil, err
	}
	var self *selfManagedTLS
	if cfg.Rotator != nil {
		if self, err = newSelfManagedTLS(*cfg.Rotator, deps.RESTConfig, deps.KubeClient, cfg.CertDir); err != nil {
			return nil, err
		}
	}
	cert := &servingCert{dir: cfg.CertDir}
	w := &Webhook{health: health.NewServer(), done: make(chan struct{})}
	w.addReadinessChecks(specs, cert, self)

	// The servers run on past ctx, until the drain is over.
	serveCtx, stopServing := context.WithCancel(context.WithoutCancel(ctx))
	factory.Start(serveCtx.Done())
	var fatal <-chan error
	if self != nil {
		fatal = self.start(serveCtx)
	}
	go cert.watch(klog.NewContext(serveCtx, logger.WithName("tls")))
	srv, err := w.serve(serveCtx, cfg, deps.MetricsAccess, specs, apiPods{client: deps.KubeClient}, cert)
	if err != nil {
		stopServing()
		return nil, err
	}
	go func() {
		defer close(w.done)
		defer stopServing()
		w.err = w.stop(ctx, cfg.ShutdownDelay, fatal, srv)
	}()
	return w, nil
}

// addReadinessChecks: ready once the caches have synced, a certificate is loaded (and,
// self-managed, its CA is in the webhook configurations), and not shutting down.
func (w *Webhook) addReadinessChecks(specs *CacheSpecs, cert *servingCert, self *selfManagedTLS) {
	w.health.AddReadiness("caches", func(context.Context) error {
		if !specs.Synced() {
			return errors.New("ResourceClaim and ResourceClaimTemplate caches not synced yet")
		}
		return nil
	})
	w.health.AddReadiness("certificate", cert.Check)
	if self != nil {
		w.health.AddReadiness("ca-injected", self.Check)
	}
	w.health.AddReadiness("serving", func(context.Context) error {
		if w.drainer.draining.Load() {
			return errors.New("shutting down")
		}
		return nil
	})
}

// serve starts the admission, health and metrics servers.
func (w *Webhook) serve(ctx context.Context, cfg Config, access *component.MetricsAccess, specs Specs, pods Pods, cert *servingCert) (*httpsServer, error) {
	reg := component.NewMetricsRegistry()
	reviewer := NewReviewer(cfg.Rules, specs, pods, metrics.NewWebhookMetrics(reg))
	srv, err := serveHTTPS(ctx, cfg.Address, w.drainer.wrap(reviewer.Handler(ctx)), cert.GetCertificate)
	if err != nil {
		return nil, err
	}
	w.Addr = srv.addr
	if w.HealthAddr, err = w.health.Serve(ctx, cfg.HealthAddress); err == nil {
		w.MetricsAddr, err = component.ServeMetrics(ctx, cfg.MetricsAddress, reg, access)
	}
	if err != nil {
		return nil, errors.Join(err, srv.shutdown(time.Second))
	}
	return srv, nil
}

// stop waits for ctx to end, drains, and stops the admission server; or stops it at once when
// the rotator fails.
func (w *Webhook) stop(ctx context.Context, delay time.Duration, fatal <-chan error, srv *httpsServer) error {
	var err error
	select {
	case <-ctx.Done():
		w.drainer.drain(ctx, delay)
	case err = <-fatal:
	}
	return errors.Join(err, srv.shutdown(10*time.Second))
}

// Ready runs the readiness checks: nil once the caches have synced, a certificate is loaded
// (and, self-managed, its CA injected), and the webhook is not shutting down.
func (w *Webhook) Ready(ctx context.Context) error { return w.health.EvaluateReadiness(ctx) }

// Wait returns once the webhook has stopped, with the error that stopped it.
func (w *Webhook) Wait() error {
	<-w.done
	if w.err != nil {
		return fmt.Errorf("vgpu-webhook: %w", w.err)
	}
	return nil
}
