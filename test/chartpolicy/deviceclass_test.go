package chartpolicy

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"

	"github.com/vgpu-dra/vgpu-dra/pkg/api/v1alpha1"
)

// TestComputeDeviceClasses: the chart's compute classes select the driver's devices and carry a
// VGPUConfig that the plugin decodes strictly, so that a claim of best-effort.vgpu.dra.dev is
// prepared best-effort (the class's entry reaches the allocation result FromClass) and one of
// guaranteed.vgpu.dra.dev guaranteed; only the main class has the extended resource. With the
// value off, only the main class is rendered.
func TestComputeDeviceClasses(t *testing.T) {
	render := func(computeClasses bool) map[string]resourceapi.DeviceClass {
		out := map[string]resourceapi.DeviceClass{}
		for _, doc := range renderTemplate(t, "deviceclass.yaml", map[string]any{"deviceClass.computeClasses": computeClasses}) {
			var c resourceapi.DeviceClass
			if err := yaml.UnmarshalStrict([]byte(doc), &c); err != nil {
				t.Fatalf("a DeviceClass of the chart: %v\n%s", err, doc)
			}
			out[c.Name] = c
		}
		return out
	}
	classes := render(true)
	if len(classes) != 3 || classes["vgpu.dra.dev"].Spec.ExtendedResourceName == nil {
		t.Fatalf("DeviceClasses %v: want the main class, with the extended resource, and two compute classes", classes)
	}
	for name, want := range map[string]v1alpha1.Class{"guaranteed.vgpu.dra.dev": v1alpha1.Guaranteed, "best-effort.vgpu.dra.dev": v1alpha1.BestEffort} {
		c, ok := classes[name]
		if !ok {
			t.Errorf("no DeviceClass %s", name)
			continue
		}
		if c.Spec.ExtendedResourceName != nil || len(c.Spec.Selectors) != 1 || c.Spec.Selectors[0].CEL.Expression != `device.driver == "vgpu.dra.dev"` {
			t.Errorf("%s: %+v", name, c.Spec)
		}
		// What the scheduler copies into the allocation result, as Prepare resolves it.
		var configs []resourceapi.DeviceAllocationConfiguration
		for _, e := range c.Spec.Config {
			configs = append(configs, resourceapi.DeviceAllocationConfiguration{Source: resourceapi.AllocationConfigSourceClass,
				DeviceConfiguration: e.DeviceConfiguration})
		}
		cfg, err := v1alpha1.ForRequest(configs, "gpu", 30)
		if err != nil || cfg.Class != want || cfg.CoresCeiling != nil {
			t.Errorf("%s: configuration %+v, %v; want class %s, no ceiling", name, cfg, err, want)
		}
	}
	if got := render(false); len(got) != 1 {
		t.Errorf("computeClasses off: %d DeviceClasses, want 1", len(got))
	}
}
