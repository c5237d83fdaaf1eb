package chartschema

import (
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/cdi"
	"github.com/vgpu-dra/vgpu-dra/pkg/deviceplugin"
	"github.com/vgpu-dra/vgpu-dra/pkg/driver"
	"github.com/vgpu-dra/vgpu-dra/pkg/enforce"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/plugin"
	"github.com/vgpu-dra/vgpu-dra/pkg/webhook"
)

// parityCase is a value with a syntax or a range, the check of the binaries the chart passes it
// to, and samples of it.
type parityCase struct {
	path    string
	binary  accepts
	samples []any
	// differs: samples (as JSON) on which the schema deliberately disagrees, and why.
	differs map[string]string
}

// Samples of the value kinds. Numbers are what helm --set and YAML give for unquoted digits.
var (
	quantities = []any{"0", "32Mi", "1Gi", "1.5Gi", ".5Gi", "1.", "+1Mi", "1e6", "1E6", "1e+6", "1e-3",
		"100m", "1k", "1M", "2Ki", 0, 1048576, 1.5, "", "lots", "1K", "1ki", "1 Mi", "1e3.5", "-1Mi", -1,
		"-0", ".", "Mi"}
	// quantityQuirks: what resource.ParseQuantity reads as 0 outside its documented grammar.
	quantityQuirks = map[string]string{`"-0"`: "a sign", `"."`: "no digits", `"Mi"`: "no digits"}

	fsSizes      = []any{"0", "1Mi", "32Mi", "+1Mi", "1.5Gi", "1e9", 0, 1048576, 33554432, "", "lots", "-1Mi", "512Ki"}
	fsSizeQuirks = map[string]string{`"512Ki"`: "under the 1Mi minimum, which only the binary checks"}

	durations = []any{"0", "0s", "+0", "5m", "1h30m", "250ms", "1.5s", ".5s", "1.s", "1µs", "1μs", "1us", "1ns",
		"00s", 0, "5", 5, "1d", "", "s", ".s", "1h 30m", "-1s", "1e3s", "-0", "300000000000h"}
	durationQuirks = map[string]string{`"-0"`: "a sign, read as 0", `"300000000000h"`: "overflows: only the parser can tell"}

	// emptyIsDefault: the schema refuses an empty policy that the binaries read as their default.
	emptyIsDefault = map[string]string{`""`: "empty is the binary's default, which values.yaml spells out"}
)

// deviceSources are samples of deviceSource: each simulated profile the binaries know, with
// counts in and out of range, and malformed ones.
func deviceSources() []any {
	var out []any
	for _, p := range gpu.SimulatedProfiles() {
		out = append(out, "simulated:"+p, "simulated:"+p+":1", "simulated:"+p+":8", "simulated:"+p+":9")
	}
	return append(out, "nvml", "nvml:0", "NVML", "simulated", "simulated:", "simulated:dgx-h200:",
		"simulated:dgx-h200:0", "simulated:dgx-h200:+3", "simulated:dgx-h200:08", "simulated:dgx-h200:-0",
		"simulated:dgx-h200:-1", "simulated:dgx-h200:x", "simulated:dgx-h200:1:2", "simulated:dgx-x100", "bogus", "")
}

func parityCases() []parityCase {
	return []parityCase{
		{"deviceSource", deviceSource, deviceSources(), nil},
		{"memoryReserve", all(pluginQuantity(func(c *plugin.Config) *int64 { return &c.MemoryReserve }),
			devicePluginQuantity(func(c *deviceplugin.Config) *int64 { return &c.Sizing.MemoryReserve })), quantities, quantityQuirks},
		{"enforce.slackPerProcess", all(pluginQuantity(func(c *plugin.Config) *int64 { return &c.Enforcement.SlackPerProcess }),
			devicePluginQuantity(func(c *deviceplugin.Config) *int64 { return &c.Enforcement.SlackPerProcess })), quantities, quantityQuirks},
		{"devicePlugin.shareMemory", devicePluginQuantity(func(c *deviceplugin.Config) *int64 { return &c.Sizing.ShareMemory }), quantities, quantityQuirks},
		{"claimFSSize", pluginQuantity(func(c *plugin.Config) *int64 { return &c.ClaimFSBytes }), fsSizes, fsSizeQuirks},
		{"devicePlugin.claimFSSize", devicePluginQuantity(func(c *deviceplugin.Config) *int64 { return &c.ClaimFSBytes }), fsSizes, fsSizeQuirks},

		{"reconcileInterval", pluginDuration(func(c *plugin.Config) *time.Duration { return &c.ReconcileInterval }), durations, durationQuirks},
		{"usageInterval", pluginDuration(func(c *plugin.Config) *time.Duration { return &c.UsageInterval }), durations, durationQuirks},
		{"nri.failureGrace", pluginDuration(func(c *plugin.Config) *time.Duration { return &c.NRIFailureGrace }), durations, durationQuirks},
		{"enforce.period", enforcerDuration(func(s *enforce.Settings) *time.Duration { return &s.Period }), durations, durationQuirks},
		{"enforce.grace", enforcerDuration(func(s *enforce.Settings) *time.Duration { return &s.Grace }), durations, durationQuirks},
		{"enforce.coreWindow", enforcerDuration(func(s *enforce.Settings) *time.Duration { return &s.CoreWindow }), durations, durationQuirks},
		{"webhook.missingClaimWait", webhookDuration(func(c *webhook.Config) *time.Duration { return &c.MissingClaimWait }), durations, durationQuirks},
		{"webhook.shutdownDelay", webhookDuration(func(c *webhook.Config) *time.Duration { return &c.ShutdownDelay }), durations, durationQuirks},
		{"webhook.tls.certManager.duration", certManagerDuration, []any{"2160h", "90m", "1h30m", "0s", "0", 0, "90d", "", "lots"},
			map[string]string{`"0"`: "written unquoted, it reaches cert-manager as a number", "0": "written unquoted, it reaches cert-manager as a number"}},

		{"nri.pluginIndex", inPlugin(func(c *plugin.Config, v string) { c.NRIPluginIndex = v }),
			[]any{"00", "07", "99", "", 10, 99, "5", 5, "100", 100, "ab", "0a"}, nil},
		{"gpuInjection", all(inPlugin(func(c *plugin.Config, v string) { c.GPUInjection = cdi.Injection(v) }),
			inDevicePlugin(func(c *deviceplugin.Config, v string) { c.GPUInjection = cdi.Injection(v) })),
			[]any{"cdi", "env", "none", "", "magic", "CDI"}, nil},
		{"gpuCDIKind", gpuCDIKind, []any{"nvidia.com/gpu", "", "v/g", "nvidia.com", "a/b/c", "1v/gpu", "v/gpu-", "v/"}, nil},
		{"staleClaimContainers", inPlugin(func(c *plugin.Config, v string) { c.StaleClaimContainers = driver.StaleInUsePolicy(v) }),
			[]any{"keep", "stop", "", "kill"}, emptyIsDefault},
		{"enforce.foreignGPUProcess", all(inPlugin(func(c *plugin.Config, v string) { c.Enforcement.Foreign = enforce.Policy(v) }),
			inDevicePlugin(func(c *deviceplugin.Config, v string) { c.Enforcement.Foreign = enforce.Policy(v) })),
			[]any{"report", "kill", "", "ignore"}, emptyIsDefault},
		{"enforce.coreEnforcement", all(inPlugin(func(c *plugin.Config, v string) { c.Enforcement.Cores = enforce.CoreMode(v) }),
			inDevicePlugin(func(c *deviceplugin.Config, v string) { c.Enforcement.Cores = enforce.CoreMode(v) })),
			[]any{"report", "throttle", "off", "", "on"}, emptyIsDefault},
		{"enforce.coreMargin", coreMargin, []any{1, 10, 100, 0, 101, -1}, nil},
		{"webhook.containerPolicy", func(v string) error { _, err := webhook.ParseContainerPolicy(v); return err },
			[]any{"audit", "require-readonly-root", "require-non-root", "", "strict"}, nil},
		{"webhook.maxMissingClaimWaits", maxMissingClaimWaits, []any{1, 32, 0, -1}, nil},
		{"devicePlugin.allocationPolicy", inDevicePlugin(func(c *deviceplugin.Config, v string) { c.Policy = deviceplugin.Policy(v) }),
			[]any{"binpack", "spread", "", "random"}, nil},
		{"devicePlugin.sharesPerGPU", devicePlugin(func(c *deviceplugin.Config, v string) (err error) {
			c.Sizing.SharesPerGPU, err = integer(v)
			return err
		}), []any{1, 4, 0, -1, 1.5}, nil},
		{"devicePlugin.shareCores", devicePluginInt(func(c *deviceplugin.Config) *int64 { return &c.Sizing.ShareCores }),
			[]any{0, 30, 100, 101, -1}, nil},
		{"devicePlugin.resourceName", inDevicePlugin(func(c *deviceplugin.Config, v string) { c.ResourceName = v }),
			[]any{"vgpu.dra.dev/vgpu", "example.com/gpu", "nodomain", "a/b/c", "example.com/", "Example.com/gpu", "kubernetes.io/gpu"},
			map[string]string{`"kubernetes.io/gpu"`: "the kubernetes.io domains are the binary's check"}},
		{"usageMaxSeries", pluginInt(func(c *plugin.Config) *int { return &c.UsageMaxSeries }), []any{0, 1024, -1}, nil},
		{"stateDir", all(inPlugin(func(c *plugin.Config, v string) { c.StateDir = v }),
			inDevicePlugin(func(c *deviceplugin.Config, v string) { c.StateDir = v })),
			[]any{"/var/lib/vgpu-dra", "var/lib/vgpu-dra", ""}, nil},
		{"cdiDir", all(inPlugin(func(c *plugin.Config, v string) { c.CDIDir = v }),
			inDevicePlugin(func(c *deviceplugin.Config, v string) { c.CDIDir = v })),
			[]any{"/var/run/cdi", "cdi", ""}, nil},

		{"metrics.auth", sharedFlag("metrics-auth"), []any{"delegated", "none", "", "open"}, nil},
		{"logging.format", sharedFlag("logging-format"), []any{"text", "json", "", "xml"}, nil},
		{"logging.verbosity", sharedFlag("v"), []any{0, 4, 2147483647, 2147483648, -1, 1.5, "4"},
			map[string]string{`"4"`: "a number, as values.yaml writes it"}},
		{"kubeAPI.qps", sharedFlag("kube-api-qps"), []any{50, 0.5, 0.001, 0, -1, "0.5", "50", "1e2", ".5", "0", "0.0", "-1", "", "fast"}, nil},
		{"kubeAPI.burst", sharedFlag("kube-api-burst"), []any{100, 1, 0, -1, 1.5}, nil},
	}
}
