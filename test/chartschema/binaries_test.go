package chartschema

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/component"
	"github.com/vgpu-dra/vgpu-dra/pkg/deviceplugin"
	"github.com/vgpu-dra/vgpu-dra/pkg/driver"
	"github.com/vgpu-dra/vgpu-dra/pkg/enforce"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/plugin"
	"github.com/vgpu-dra/vgpu-dra/pkg/webhook"
)

// accepts says whether the binaries take a value as the chart renders it into their flags
// (fmt.Sprint, as a template prints it): nil when they do. Each turns the flag into
// configuration as its cmd/*/main.go does and then asks the package's own Validate.
type accepts func(rendered string) error

// all accepts what every one of the checks accepts: a value the chart passes to more than one
// binary (memoryReserve reaches both plugins).
func all(checks ...accepts) accepts {
	return func(v string) error {
		for _, check := range checks {
			if err := check(v); err != nil {
				return err
			}
		}
		return nil
	}
}

// kubeletPlugin sets a value into a valid kubelet-plugin configuration and validates it.
func kubeletPlugin(set func(c *plugin.Config, v string) error) accepts {
	return func(v string) error {
		c := plugin.Config{
			NodeName: "node-1", DriverName: "vgpu.dra.dev", StateDir: "/var/lib/vgpu-dra",
			KubeletDir: "/var/lib/kubelet", CDIDir: "/var/run/cdi", GPUInjection: cdi.InjectionCDI,
			VGPU: true, NRI: true, NRISocket: "/var/run/nri/nri.sock", NRIPluginIndex: "00",
			ClaimFSBytes: plugin.DefaultClaimFSBytes, StaleClaimContainers: driver.StaleInUseKeep,
		}
		if err := set(&c, v); err != nil {
			return err
		}
		return c.Validate()
	}
}

// devicePlugin sets a value into a valid device-plugin configuration and validates it.
func devicePlugin(set func(c *deviceplugin.Config, v string) error) accepts {
	return func(v string) error {
		c := deviceplugin.Config{
			NodeName: "node-1", DriverName: "vgpu.dra.dev", ResourceName: "vgpu.dra.dev/vgpu",
			StateDir: "/var/lib/vgpu-dra", KubeletDir: "/var/lib/kubelet", CDIDir: "/var/run/cdi",
			Sizing: deviceplugin.Sizing{SharesPerGPU: 4}, Policy: deviceplugin.PolicyBinpack, GPUInjection: cdi.InjectionCDI,
		}
		if err := set(&c, v); err != nil {
			return err
		}
		return c.Validate()
	}
}

// inPlugin and inDevicePlugin: a value the plugin's cmd sets into its configuration as it is.
func inPlugin(set func(c *plugin.Config, v string)) accepts {
	return kubeletPlugin(func(c *plugin.Config, v string) error { set(c, v); return nil })
}

func inDevicePlugin(set func(c *deviceplugin.Config, v string)) accepts {
	return devicePlugin(func(c *deviceplugin.Config, v string) error { set(c, v); return nil })
}

// webhookConfig sets a value into a valid webhook configuration and validates it.
func webhookConfig(set func(c *webhook.Config, v string) error) accepts {
	return func(v string) error {
		c := webhook.Config{Address: ":8443", CertDir: "/var/run/vgpu-webhook/tls"}
		c.Rules.DeviceClasses, c.Rules.UUIDAttribute = []string{"vgpu.dra.dev"}, "vgpu.dra.dev/uuid"
		if err := set(&c, v); err != nil {
			return err
		}
		return c.Validate()
	}
}

// sharedFlag parses one of the flags every binary shares (pkg/component) and validates them.
func sharedFlag(flag string) accepts {
	return func(v string) error {
		o, err := component.NewOptions("chartschema", 1)
		if err != nil {
			return err
		}
		fs := pflag.NewFlagSet("chartschema", pflag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o.AddFlags(fs)
		if err := fs.Parse([]string{"--" + flag + "=" + v}); err != nil {
			return err
		}
		return o.Validate()
	}
}

// The conversions of cmd/*/main.go: resource quantities (the device plugin reads empty as 0),
// durations (pflag's DurationVar), integers (IntVar, Int64Var, UintVar).

func quantity(v string) (int64, error) {
	q, err := resource.ParseQuantity(v)
	return q.Value(), err
}

func quantityOrEmpty(v string) (int64, error) {
	if v == "" {
		return 0, nil
	}
	return quantity(v)
}

func integer(v string) (int, error) {
	n, err := strconv.ParseInt(v, 0, 64)
	return int(n), err
}

func pluginQuantity(field func(*plugin.Config) *int64) accepts {
	return kubeletPlugin(func(c *plugin.Config, v string) (err error) {
		*field(c), err = quantity(v)
		return err
	})
}

func devicePluginQuantity(field func(*deviceplugin.Config) *int64) accepts {
	return devicePlugin(func(c *deviceplugin.Config, v string) (err error) {
		*field(c), err = quantityOrEmpty(v)
		return err
	})
}

func pluginInt(field func(*plugin.Config) *int) accepts {
	return kubeletPlugin(func(c *plugin.Config, v string) (err error) {
		*field(c), err = integer(v)
		return err
	})
}

func devicePluginInt(field func(*deviceplugin.Config) *int64) accepts {
	return devicePlugin(func(c *deviceplugin.Config, v string) error {
		n, err := strconv.ParseInt(v, 0, 64)
		*field(c) = n
		return err
	})
}

func pluginDuration(field func(*plugin.Config) *time.Duration) accepts {
	return kubeletPlugin(func(c *plugin.Config, v string) (err error) {
		*field(c), err = time.ParseDuration(v)
		return err
	})
}

func devicePluginDuration(field func(*deviceplugin.Config) *time.Duration) accepts {
	return devicePlugin(func(c *deviceplugin.Config, v string) (err error) {
		*field(c), err = time.ParseDuration(v)
		return err
	})
}

func webhookDuration(field func(*webhook.Config) *time.Duration) accepts {
	return webhookConfig(func(c *webhook.Config, v string) (err error) {
		*field(c), err = time.ParseDuration(v)
		return err
	})
}

// enforcerDuration is a duration of the enforcer's settings, which both plugins take.
func enforcerDuration(field func(*enforce.Settings) *time.Duration) accepts {
	return all(pluginDuration(func(c *plugin.Config) *time.Duration { return field(&c.Enforcement) }),
		devicePluginDuration(func(c *deviceplugin.Config) *time.Duration { return field(&c.Enforcement) }))
}

// coreMargin is cmd/vgpu-{kubelet,device}-plugin's check of --core-enforce-margin (a UintVar).
func coreMargin(v string) error {
	n, err := strconv.ParseUint(v, 0, 64)
	if err != nil {
		return err
	}
	if n < 1 || n > 100 {
		return fmt.Errorf("--core-enforce-margin %d: want 1-100", n)
	}
	return nil
}

// maxMissingClaimWaits is cmd/vgpu-webhook's check of --max-missing-claim-waits, then Validate's.
func maxMissingClaimWaits(v string) error {
	return webhookConfig(func(c *webhook.Config, v string) (err error) {
		if c.MaxMissingClaimWaits, err = integer(v); err == nil && c.MaxMissingClaimWaits < 1 {
			err = fmt.Errorf("--max-missing-claim-waits %d: want at least 1", c.MaxMissingClaimWaits)
		}
		return err
	})(v)
}

// deviceSource is gpu.ParseSource, which both plugins open --device-source with.
func deviceSource(v string) error {
	if v == "nvml" {
		return nil // ParseSource would open the driver, which this machine need not have
	}
	src, err := gpu.ParseSource(v, "node-1")
	if err == nil {
		_ = src.Close()
	}
	return err
}

// gpuCDIKind is what pkg/cdi checks of --gpu-cdi-kind when it writes a spec.
func gpuCDIKind(v string) error {
	if v == "" {
		return nil
	}
	vendor, class := parser.ParseQualifier(v)
	if err := parser.ValidateVendorName(vendor); err != nil {
		return err
	}
	return parser.ValidateClassName(class)
}

// certManagerDuration is how cert-manager reads a Certificate's duration (a metav1.Duration).
func certManagerDuration(v string) error {
	d, err := time.ParseDuration(v)
	if err == nil && d < 0 {
		err = fmt.Errorf("%s is negative", v)
	}
	return err
}
