package chartpolicy

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"
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
		if c.Spec.ExtendedResourceName != nil || !selects(t, c, wholeGPU) || selects(t, c, partition) || selects(t, c, foreignDevice) {
			t.Errorf("%s: %+v; want the driver's whole GPUs selected, its MIG partitions and other drivers' devices not", name, c.Spec)
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
	if main := classes["vgpu.dra.dev"]; !selects(t, main, wholeGPU) || selects(t, main, partition) {
		t.Errorf("the main class must select whole GPUs only: %+v", main.Spec)
	}
	if got := render(false); len(got) != 1 {
		t.Errorf("computeClasses off: %d DeviceClasses, want 1", len(got))
	}
}

// TestMIGDeviceClass: with mig.gpus set, the chart adds mig.vgpu.dra.dev, which selects the MIG
// partitions and nothing else (contract §18), and the webhook counts its requests as vGPU
// requests; without, there is no such class.
func TestMIGDeviceClass(t *testing.T) {
	for _, gpus := range []any{"all", 0} { // 0: --set mig.gpus=0, a number
		classes := migClasses(t, gpus)
		if _, ok := classes["mig.vgpu.dra.dev"]; !ok {
			t.Errorf("mig.gpus=%v: no mig.vgpu.dra.dev", gpus)
		}
	}
	classes := migClasses(t, "all")
	mig, ok := classes["mig.vgpu.dra.dev"]
	if !ok || !selects(t, mig, partition) || selects(t, mig, wholeGPU) || mig.Spec.ExtendedResourceName != nil {
		t.Fatalf("mig.vgpu.dra.dev %+v (present %v): want a class of the partitions only", mig.Spec, ok)
	}
	for _, doc := range renderTemplate(t, "deviceclass.yaml", nil) {
		if strings.Contains(doc, "mig.vgpu.dra.dev") {
			t.Error("mig.vgpu.dra.dev rendered with mig.gpus empty")
		}
	}
}

func migClasses(t *testing.T, gpus any) map[string]resourceapi.DeviceClass {
	t.Helper()
	classes := map[string]resourceapi.DeviceClass{}
	for _, doc := range renderTemplate(t, "deviceclass.yaml", map[string]any{"mig.gpus": gpus}) {
		var c resourceapi.DeviceClass
		if err := yaml.UnmarshalStrict([]byte(doc), &c); err != nil {
			t.Fatalf("a DeviceClass of the chart: %v\n%s", err, doc)
		}
		classes[c.Name] = c
	}
	return classes
}

// The devices a class is checked against: a whole GPU and a MIG partition as the plugin
// publishes them, and another driver's.
var (
	wholeGPU      = cel.Device{Driver: "vgpu.dra.dev", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": {StringValue: ptr.To("vgpu")}}}
	partition     = cel.Device{Driver: "vgpu.dra.dev", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": {StringValue: ptr.To("mig")}, "migProfile": {StringValue: ptr.To("1g.18gb")}}}
	foreignDevice = cel.Device{Driver: "gpu.example.com", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": {StringValue: ptr.To("vgpu")}}}
)

// selects evaluates the class's selectors as the scheduler does.
func selects(t *testing.T, c resourceapi.DeviceClass, dev cel.Device) bool {
	t.Helper()
	for _, sel := range c.Spec.Selectors {
		r := cel.GetCompiler(cel.Features{}).CompileCELExpression(sel.CEL.Expression, cel.Options{})
		if r.Error != nil {
			t.Fatalf("class %s: selector %q: %v", c.Name, sel.CEL.Expression, r.Error)
		}
		ok, _, err := r.DeviceMatches(t.Context(), dev)
		if err != nil || !ok {
			return false
		}
	}
	return true
}
