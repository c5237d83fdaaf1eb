package webhook

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/vgpu-dra/vgpu-dra/pkg/api/v1alpha1"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// ReasonInvalidConfig is the refusal of a claim or template whose opaque configuration for
// driver vgpu.dra.dev is not a valid VGPUConfig (contract §17).
const ReasonInvalidConfig = "invalid_config"

// Where a claim's and a template's configuration entries are, for the field paths of messages.
var (
	claimConfigPath    = field.NewPath("spec", "devices", "config")
	templateConfigPath = field.NewPath("spec", "spec", "devices", "config")
)

// configRules checks every opaque configuration entry of the spec for driver vgpu.dra.dev
// (contract §17): it must decode strictly as a VGPUConfig, and be valid against the cores of
// each request of our classes it applies to (no requests: all of them; "r" covers the
// subrequests "r/s"). Prepare checks the configuration again with the DeviceClass's entries,
// which admission does not see. object names the claim or template; path is its config list.
func configRules(spec *resourceapi.ResourceClaimSpec, sel Selection, object string, path *field.Path) []Violation {
	var out []Violation
	for i, c := range spec.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != v1alpha1.GroupName {
			continue
		}
		p := path.Index(i).Child("opaque", "parameters")
		cfg, err := v1alpha1.Decode(c.Opaque.Parameters.Raw, p)
		if err != nil {
			out = append(out, Violation{ReasonInvalidConfig, fmt.Sprintf("%s: %v", object, err)})
			continue
		}
		applied := false
		for _, r := range ourRequests(spec.Devices.Requests, sel) {
			if !v1alpha1.AppliesTo(c.Requests, r.name) {
				continue
			}
			applied = true
			if errs := v1alpha1.Validate(cfg, r.cores, p); len(errs) > 0 {
				out = append(out, Violation{ReasonInvalidConfig, fmt.Sprintf("%s: request %q: %v", object, r.name, errs.ToAggregate())})
			}
		}
		// An entry that no request of ours takes is still checked for what holds whatever the
		// request: the class, and a ceiling of at most 100.
		if !applied {
			if errs := v1alpha1.Validate(cfg, contract.CoresMinimum, p); len(errs) > 0 {
				out = append(out, Violation{ReasonInvalidConfig, fmt.Sprintf("%s: %v", object, errs.ToAggregate())})
			}
		}
	}
	return out
}

// namedCores is one request (or subrequest, "r/s") of our classes and the cores it asks for (0:
// none named, the whole GPU by the request policy's default).
type namedCores struct {
	name  string
	cores int64
}

func ourRequests(requests []resourceapi.DeviceRequest, sel Selection) []namedCores {
	var out []namedCores
	for _, r := range requests {
		if r.Exactly != nil && sel.isOurClass(r.Exactly.DeviceClassName) {
			out = append(out, namedCores{r.Name, coresAsked(r.Exactly.Capacity)})
		}
		for _, s := range r.FirstAvailable {
			if sel.isOurClass(s.DeviceClassName) {
				out = append(out, namedCores{r.Name + "/" + s.Name, coresAsked(s.Capacity)})
			}
		}
	}
	return out
}

func coresAsked(c *resourceapi.CapacityRequirements) int64 {
	if c == nil {
		return 0
	}
	q, ok := c.Requests[contract.CapacityCores]
	if !ok {
		return 0
	}
	return q.Value()
}
