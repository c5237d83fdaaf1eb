// Package featuregates registers the plugin's feature gates with component-base's featuregate
// registry. Gates are read in cmd only (and in the code that turns flags into configuration);
// packages receive plain configuration values.
package featuregates

import (
	"fmt"

	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
)

const (
	// VGPUSupport publishes GPUs as shareable devices with consumable memory and cores.
	// Off: whole GPUs, exclusive, no library.
	VGPUSupport featuregate.Feature = "VGPUSupport"
	// NRISupport gives every container its own directories and identity through the embedded
	// NRI plugin. Requires VGPUSupport.
	NRISupport featuregate.Feature = "NRISupport"
	// DeviceHealthCheck turns NVML health events into device taints and WatchHealthStatus reports.
	DeviceHealthCheck featuregate.Feature = "DeviceHealthCheck"
)

var specs = map[featuregate.Feature]featuregate.FeatureSpec{
	VGPUSupport:       {Default: true, PreRelease: featuregate.Beta},
	NRISupport:        {Default: true, PreRelease: featuregate.Beta},
	DeviceHealthCheck: {Default: true, PreRelease: featuregate.Beta},
}

// dependencies: a gate listed on the left may only be enabled when every gate on the right is.
var dependencies = map[featuregate.Feature][]featuregate.Feature{
	NRISupport: {VGPUSupport},
}

// New returns a fresh gate set holding the plugin's gates and component-base's logging gates.
// Setting the gates (flag --feature-gates) fails with a clear error when a dependency is broken,
// e.g. "NRISupport is enabled, but depends on features that are disabled: [VGPUSupport]".
func New() (featuregate.MutableVersionedFeatureGate, error) {
	fg := featuregate.NewFeatureGate()
	if err := fg.Add(specs); err != nil {
		return nil, fmt.Errorf("register feature gates: %w", err)
	}
	if err := fg.AddDependencies(copyDeps()); err != nil {
		return nil, fmt.Errorf("register feature gate dependencies: %w", err)
	}
	if err := logsapi.AddFeatureGates(fg); err != nil {
		return nil, fmt.Errorf("register logging feature gates: %w", err)
	}
	return fg, nil
}

// Validate reports every broken dependency of the gates as set; nil when consistent.
func Validate(fg featuregate.FeatureGate) error {
	var errs []error
	for feature, deps := range dependencies {
		if !fg.Enabled(feature) {
			continue
		}
		for _, dep := range deps {
			if !fg.Enabled(dep) {
				errs = append(errs, fmt.Errorf("feature gate %s requires %s, which is disabled", feature, dep))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid --feature-gates: %v", errs)
	}
	return nil
}

func copyDeps() map[featuregate.Feature][]featuregate.Feature {
	out := make(map[featuregate.Feature][]featuregate.Feature, len(dependencies))
	for k, v := range dependencies {
		out[k] = append([]featuregate.Feature(nil), v...)
	}
	return out
}
