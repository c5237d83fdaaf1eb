package component

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json

	"github.com/vgpu-dra/vgpu-dra/pkg/featuregates"
)

// Defaults of the shared flags.
const (
	// DefaultKubeAPIQPS and DefaultKubeAPIBurst are well above client-go's 5/10: the kubelet
	// plugin's helper GETs every claim before Prepare sees it, and at 5 QPS a burst of pods
	// waits seconds on the client's own rate limiter (docs/performance.md).
	DefaultKubeAPIQPS   = 50
	DefaultKubeAPIBurst = 100
	// DefaultMetricsAddress serves /metrics on every interface.
	DefaultMetricsAddress = ":8080"
)

// Options are the flags every vgpu-dra binary takes. Build them with NewOptions; after the flag
// set is parsed, Complete validates them and applies the logging configuration.
type Options struct {
	// Name is the binary's name: the user agent of its API requests and the logger's name.
	Name string
	// Kubeconfig is a kubeconfig file; the in-cluster configuration when empty.
	Kubeconfig   string
	KubeAPIQPS   float32
	KubeAPIBurst int
	// MetricsAddress serves /metrics; empty disables it.
	MetricsAddress string
	// MetricsAuth is who may read /metrics: MetricsAuthDelegated (the default) or MetricsAuthNone.
	MetricsAuth MetricsAuth
	// HealthPort serves grpc.health.v1 (or the binary's own probe endpoint); negative disables it.
	HealthPort int
	Logging    *logsapi.LoggingConfiguration
	Gates      featuregate.MutableVersionedFeatureGate
}

// NewOptions returns the shared options with their defaults. healthPort is the binary's default
// health port (each binary has its own, so that two of them can share a host network).
func NewOptions(name string, healthPort int) (*Options, error) {
	gates, err := featuregates.New()
	if err != nil {
		return nil, err
	}
	return &Options{
		Name: name, Kubeconfig: os.Getenv("KUBECONFIG"),
		KubeAPIQPS: DefaultKubeAPIQPS, KubeAPIBurst: DefaultKubeAPIBurst,
		MetricsAddress: DefaultMetricsAddress, MetricsAuth: MetricsAuthDelegated, HealthPort: healthPort,
		Logging: logsapi.NewLoggingConfiguration(), Gates: gates,
	}, nil
}

// AddFlags adds the shared flags to fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Kubeconfig file (default $KUBECONFIG); in-cluster configuration when empty.")
	fs.Float32Var(&o.KubeAPIQPS, "kube-api-qps", o.KubeAPIQPS, "Client-side QPS limit for API requests (client-go's default of 5 turns a burst of pods into seconds).")
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", o.KubeAPIBurst, "Client-side burst for API requests.")
	fs.StringVar(&o.MetricsAddress, "metrics-address", o.MetricsAddress, "Address of the Prometheus /metrics endpoint; empty disables it.")
	fs.StringVar((*string)(&o.MetricsAuth), "metrics-auth", string(o.MetricsAuth), "Who may read /metrics: delegated (HTTPS; a bearer token the API server authenticates, whose user may get the non-resource URL /metrics) or none (plain HTTP, anyone).")
	fs.IntVar(&o.HealthPort, "health-port", o.HealthPort, "Port of the health endpoint (liveness, readiness and startup probes); negative disables it.")
	o.Gates.AddFlag(fs)
	logsapi.AddFlags(o.Logging, fs)
}

// Validate checks the shared flags and reports every problem at once.
func (o *Options) Validate() error {
	var errs []error
	if o.KubeAPIQPS <= 0 || o.KubeAPIBurst <= 0 {
		errs = append(errs, errors.New("--kube-api-qps and --kube-api-burst must be positive"))
	}
	if o.MetricsAuth != MetricsAuthDelegated && o.MetricsAuth != MetricsAuthNone {
		errs = append(errs, fmt.Errorf("--metrics-auth=%s: want %s or %s", o.MetricsAuth, MetricsAuthDelegated, MetricsAuthNone))
	}
	if err := featuregates.Validate(o.Gates); err != nil {
		errs = append(errs, err)
	}
	if err := logsapi.Validate(o.Logging, o.Gates, nil).ToAggregate(); err != nil {
		errs = append(errs, fmt.Errorf("logging flags: %w", err))
	}
	return errors.Join(errs...)
}

// Complete validates the shared flags and applies the logging configuration, which a process
// can do only once. Call it once, after parsing.
func (o *Options) Complete() error {
	if err := o.Validate(); err != nil {
		return err
	}
	if err := logsapi.ValidateAndApply(o.Logging, o.Gates); err != nil {
		return fmt.Errorf("logging flags: %w", err)
	}
	return nil
}

// ParseAndComplete parses args into fs (which carries these options' flags) and completes the
// options. help is true when the user asked for --help: the usage was printed and the command
// should exit 0 without running.
func (o *Options) ParseAndComplete(fs *pflag.FlagSet, args []string) (help bool, err error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return true, nil
		}
		return false, err
	}
	return false, o.Complete()
}

// HealthAddress is ":<port>", or "" when the health endpoint is disabled.
func (o *Options) HealthAddress() string {
	if o.HealthPort < 0 {
		return ""
	}
	return fmt.Sprintf(":%d", o.HealthPort)
}

// Enabled reports whether a feature gate is on.
func (o *Options) Enabled(f featuregate.Feature) bool { return o.Gates.Enabled(f) }

// RESTConfig is the client configuration: the kubeconfig file, else in-cluster, with the
// binary's rate limits and a user agent "<name>/<instance>" (instance: the node or pod name,
// so that the API server's audit log tells the instances apart).
func (o *Options) RESTConfig(instance string) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if o.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("build Kubernetes client config: %w", err)
	}
	rc.QPS, rc.Burst = o.KubeAPIQPS, o.KubeAPIBurst
	rc.UserAgent = o.Name
	if instance != "" {
		rc.UserAgent += "/" + instance
	}
	return rc, nil
}

// MetricsAccess is the guard of /metrics that --metrics-auth asks for: nil for none; for
// delegated, reviews through a client of its own (RESTConfig(instance), with its own
// client-side rate limit), so that a flood of made-up tokens never delays the binary's own API
// calls.
func (o *Options) MetricsAccess(instance string) (*MetricsAccess, error) {
	if o.MetricsAuth == MetricsAuthNone || o.MetricsAddress == "" {
		return nil, nil
	}
	kube, err := o.KubeClient(instance)
	if err != nil {
		return nil, err
	}
	return NewDelegatedMetricsAccess(kube)
}

// KubeClient is a clientset built from RESTConfig.
func (o *Options) KubeClient(instance string) (kubernetes.Interface, error) {
	rc, err := o.RESTConfig(instance)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("create Kubernetes client: %w", err)
	}
	return cs, nil
}
