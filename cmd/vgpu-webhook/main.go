// Command vgpu-webhook is the admission webhook of vgpu-dra: it adds the required-plugins
// annotation to containers that use a vGPU and refuses pods and claims that would break the
// sharing rules (contract §12). Flags → Config → run.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/component"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/featuregates"
	"github.com/vgpu-dra/vgpu-dra/pkg/webhook"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "vgpu-webhook:", err)
		os.Exit(1)
	}
}

// defaultHealthPort is one above the kubelet plugin's, so that both can share a host network.
const defaultHealthPort = 51516

// TLS modes (--tls-mode).
const (
	tlsSelfManaged = "self-managed"
	tlsFiles       = "files"
)

// flags holds the webhook's own flags and the values that need conversion before they become
// Config; the flags every binary shares are in common.
type flags struct {
	common           *component.Options
	cfg              webhook.Config
	podName          string
	driverName       string
	extendedResource string
	containerPolicy  string
	tlsMode          string
	tlsSecret        string
	rotator          webhook.RotatorConfig
}

func run(args []string) error {
	fs := pflag.NewFlagSet("vgpu-webhook", pflag.ContinueOnError)
	f, err := addFlags(fs)
	if err != nil {
		return err
	}
	if help, err := f.common.ParseAndComplete(fs, args); help || err != nil {
		return err
	}
	cfg, err := f.config()
	if err != nil {
		return err
	}
	return component.Run(f.common, func(ctx context.Context) error {
		rc, err := f.common.RESTConfig(f.podName)
		if err != nil {
			return err
		}
		kube, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return fmt.Errorf("create Kubernetes client: %w", err)
		}
		metricsAccess, err := f.common.MetricsAccess(f.podName)
		if err != nil {
			return err
		}
		w, err := webhook.Start(ctx, cfg, webhook.Deps{KubeClient: kube, RESTConfig: rc, MetricsAccess: metricsAccess})
		if err != nil {
			return err
		}
		err = w.Wait()
		klog.FromContext(ctx).Info("Stopped", "cause", context.Cause(ctx), "err", err)
		return err
	})
}

func addFlags(fs *pflag.FlagSet) (*flags, error) {
	common, err := component.NewOptions("vgpu-webhook", defaultHealthPort)
	if err != nil {
		return nil, err
	}
	f := &flags{common: common}
	c := &f.cfg
	fs.StringVar(&f.podName, "pod-name", os.Getenv("POD_NAME"), "Name of this pod (env POD_NAME), for the API requests' user agent.")
	fs.StringVar(&f.driverName, "driver-name", contract.DefaultDriverName, "DRA driver name: the kubelet plugin's NRI plugin name, which the required-plugins annotation names (with feature gate NRISupport), and the domain of the GPU's uuid attribute.")
	fs.StringSliceVar(&c.Rules.DeviceClasses, "device-class", []string{contract.DefaultDriverName}, "DeviceClasses whose requests are vGPU requests, comma-separated: the main one (whose extended resource is --extended-resource) first, then the compute classes' (the chart's guaranteed.<driver> and best-effort.<driver>, contract §17).")
	fs.StringVar(&f.extendedResource, "extended-resource", contract.DefaultDriverName+"/"+contract.ExtendedResourceSuffix, "Extended resource of the main DeviceClass (extendedResourceName); empty: none.")
	fs.StringVar(&c.Address, "webhook-address", ":8443", "Address of the HTTPS server the API server sends admission reviews to.")
	fs.StringVar(&c.CertDir, "cert-dir", "/var/run/vgpu-webhook/tls", "Directory of the serving certificate (tls.crt, tls.key), reloaded when it changes.")
	fs.StringVar(&f.tlsMode, "tls-mode", tlsSelfManaged, `"self-managed": cert-controller's rotator keeps a CA and the serving certificate in --tls-secret and the CA in the webhook configurations, and the webhook copies the certificate into --cert-dir; "files": someone else keeps --cert-dir (cert-manager's Secret, mounted).`)
	fs.StringVar(&f.tlsSecret, "tls-secret", "", "Self-managed mode: the Secret of the certificate, <namespace>/<name>.")
	fs.StringVar(&f.rotator.DNSName, "tls-dns-name", "", "Self-managed mode: the name the certificate is issued for, <service>.<namespace>.svc.")
	fs.StringVar(&f.rotator.MutatingConfiguration, "mutating-webhook-configuration", "", "Self-managed mode: the MutatingWebhookConfiguration whose caBundle the rotator keeps.")
	fs.StringVar(&f.rotator.ValidatingConfiguration, "validating-webhook-configuration", "", "Self-managed mode: the ValidatingWebhookConfiguration whose caBundle the rotator keeps.")
	fs.StringVar(&f.containerPolicy, "container-policy", string(webhook.PolicyAudit), "What a vGPU container must be: audit (admit, warn about root on a writable root file system), require-readonly-root or require-non-root (refuse the others, and ephemeral containers in vGPU pods); defence in depth, the wall is the node's enforcer.")
	fs.BoolVar(&c.Rules.RefuseToolkitEnv, "refuse-nvidia-visible-devices", false, "Refuse NVIDIA_VISIBLE_DEVICES (and NVIDIA_MIG_CONFIG_DEVICES, NVIDIA_MIG_MONITOR_DEVICES, NVIDIA_IMEX_CHANNELS) set to anything but void or none in the env of any unprivileged container of a reviewed pod: where the NVIDIA Container Toolkit honours it from unprivileged containers (which --gpu-injection=env needs), it would give GPUs outside any claim. Only reviewed namespaces; envFrom and image env are not seen.")
	fs.DurationVar(&c.MissingClaimWait, "missing-claim-wait", webhook.DefaultMissingClaimWait, "How long a review waits for a ResourceClaim or template that its cache has not seen (a claim created just before its pod); keep it under the webhooks' timeoutSeconds.")
	fs.IntVar(&c.MaxMissingClaimWaits, "max-missing-claim-waits", webhook.DefaultMaxMissingClaimWaits, "Most reviews that wait for a missing claim at once; beyond it a review answers at once, as if its wait had ended (the pod is refused, missing_claim).")
	fs.DurationVar(&c.ShutdownDelay, "shutdown-delay", webhook.DefaultShutdownDelay, "After SIGTERM, how long the webhook keeps answering, unready, while its endpoints are withdrawn.")
	common.AddFlags(fs)
	return f, nil
}

// config turns the flags into the webhook's Config. The shared flags are complete by then.
func (f *flags) config() (webhook.Config, error) {
	c := f.cfg
	c.Rules.ExtendedResource = corev1.ResourceName(f.extendedResource)
	policy, err := webhook.ParseContainerPolicy(f.containerPolicy)
	if err != nil {
		return c, fmt.Errorf("--container-policy: %w", err)
	}
	c.Rules.ContainerPolicy = policy
	if c.MaxMissingClaimWaits < 1 {
		return c, fmt.Errorf("--max-missing-claim-waits %d: want at least 1 (--missing-claim-wait=0 turns the wait off)", c.MaxMissingClaimWaits)
	}
	c.Rules.Driver = f.driverName
	c.Rules.UUIDAttribute = f.driverName + "/" + contract.AttributeUUID
	if f.common.Enabled(featuregates.NRISupport) {
		c.Rules.RequiredPlugin = f.driverName
	}
	c.HealthAddress = f.common.HealthAddress()
	c.MetricsAddress = f.common.MetricsAddress
	switch f.tlsMode {
	case tlsSelfManaged:
		ns, name, _ := strings.Cut(f.tlsSecret, "/")
		f.rotator.SecretNamespace, f.rotator.SecretName = ns, name
		c.Rotator = &f.rotator
	case tlsFiles:
	default:
		return c, fmt.Errorf("--tls-mode %q: want %s or %s", f.tlsMode, tlsSelfManaged, tlsFiles)
	}
	if f.driverName == "" {
		c.Rules.UUIDAttribute = ""
	}
	return c, c.Validate()
}
