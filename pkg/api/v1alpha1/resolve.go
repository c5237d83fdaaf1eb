package v1alpha1

import (
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// AllocationConfigPath is where ForRequest's errors point: the allocation result's config list.
var AllocationConfigPath = field.NewPath("status", "allocation", "devices", "config")

// ForRequest resolves the configuration of one allocated request from the allocation result's
// config list: only opaque entries for driver vgpu.dra.dev count; an entry with requests applies
// only to those (a subrequest "r/s" matches an entry naming "r"); an entry FromClaim overrides
// one FromClass, and a later entry of the same source an earlier one. No entry: the defaults.
// The result is validated against the request's consumed cores; errors name the entry's field.
func ForRequest(configs []resourceapi.DeviceAllocationConfiguration, request string, cores int64) (*VGPUConfig, error) {
	chosen, chosenAt := -1, -1
	for i, c := range configs {
		if c.Opaque == nil || c.Opaque.Driver != GroupName || !AppliesTo(c.Requests, request) {
			continue
		}
		if chosen < 0 || rank(c.Source) >= rank(configs[chosen].Source) {
			chosen, chosenAt = i, i
		}
	}
	if chosen < 0 {
		cfg := &VGPUConfig{}
		cfg.Default()
		return cfg, nil
	}
	path := AllocationConfigPath.Index(chosenAt).Child("opaque", "parameters")
	cfg, err := Decode(configs[chosen].Opaque.Parameters.Raw, path)
	if err != nil {
		return nil, err
	}
	if errs := Validate(cfg, cores, path); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return cfg, nil
}

func rank(s resourceapi.AllocationConfigSource) int {
	if s == resourceapi.AllocationConfigSourceClaim {
		return 1
	}
	return 0
}

// AppliesTo reports whether a configuration entry scoped to requests (none: every request)
// applies to request, a request's name or "<request>/<subrequest>".
func AppliesTo(requests []string, request string) bool {
	if len(requests) == 0 {
		return true
	}
	parent, _, _ := strings.Cut(request, "/")
	for _, r := range requests {
		if r == request || r == parent {
			return true
		}
	}
	return false
}
