package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
)

// ReasonDeviceClass is the refusal of a DeviceClass, other than ours, that can select our
// devices.
const ReasonDeviceClass = "device_class"

// validateDeviceClass applies classRules to a DeviceClass being created or updated.
func (r *Reviewer) validateDeviceClass(_ context.Context, req *admissionv1.AdmissionRequest) outcome {
	var c resourceapi.DeviceClass
	if err := json.Unmarshal(req.Object.Raw, &c); err != nil {
		return outcome{err: fmt.Errorf("decode the DeviceClass: %w", err)}
	}
	return outcome{violations: classRules(&c, r.rules.Selection, r.rules.Driver)}
}

// classRules refuses a DeviceClass other than ours (sel.DeviceClasses) that can select the driver's
// devices: one with no selectors (it selects every device), or one with a CEL selector that
// names the driver as a string literal (`device.driver == "<driver>"`, or the driver's
// attribute or capacity domain). The webhook knows our requests by their class's name only
// (Selection.isOurs; the chart's matchConditions too), so the claims of such a class would get
// vGPUs without the guard or the sharing rules. Refusing them keeps "a request of our class" the
// one way to a vGPU; a claim narrows our class with its own request selectors instead. A
// selector that builds the name at run time is not seen: DeviceClasses are an administrator's,
// and this guards against mistakes, not against the administrator.
func classRules(c *resourceapi.DeviceClass, sel Selection, driver string) []Violation {
	if sel.isOurClass(c.Name) || driver == "" {
		return nil
	}
	class := quotedList(sel.DeviceClasses)
	fix := fmt.Sprintf("claims that want vgpu-dra's devices ask for DeviceClass %s and narrow it with their own request "+
		"selectors (spec.devices.requests[].exactly.selectors)", class)
	if len(c.Spec.Selectors) == 0 {
		return []Violation{{ReasonDeviceClass, fmt.Sprintf(
			"DeviceClass %q has no selectors, so it selects every device, vgpu-dra's (driver %q) too, and vgpu-webhook "+
				"guards only the requests of DeviceClass %s: a claim of this class could get a vGPU without the "+
				"required-plugins annotation and the sharing rules; add a selector naming the driver it is for "+
				"(device.driver == \"<driver>\"); %s", c.Name, driver, class, fix)}}
	}
	for _, s := range c.Spec.Selectors {
		if s.CEL != nil && namesDriver(s.CEL.Expression, driver) {
			return []Violation{{ReasonDeviceClass, fmt.Sprintf(
				"DeviceClass %q has the selector %q, which names vgpu-dra's driver %q, and vgpu-webhook guards only the "+
					"requests of DeviceClass %s: a claim of this class would get vGPUs without the required-plugins "+
					"annotation and the sharing rules; %s", c.Name, s.CEL.Expression, driver, class, fix)}}
		}
	}
	return nil
}

// namesDriver reports whether a CEL expression holds the driver's name as a whole string
// literal, in either quote.
func namesDriver(expression, driver string) bool {
	return strings.Contains(expression, `"`+driver+`"`) || strings.Contains(expression, `'`+driver+`'`)
}

// quotedList is `"a"`, `"a" or "b"`, `"a", "b" or "c"`.
func quotedList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	if len(q) <= 1 {
		return strings.Join(q, "")
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}
