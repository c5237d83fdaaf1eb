package webhook

import (
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestDeviceClasses: a DeviceClass other than ours that can select the driver's devices (a CEL
// selector naming the driver, or no selector) is refused on CREATE and UPDATE, naming the
// class and the fix; ours, and classes of other drivers, are admitted.
func TestDeviceClasses(t *testing.T) {
	class := func(name string, expressions ...string) *resourceapi.DeviceClass {
		c := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
		for _, e := range expressions {
			c.Spec.Selectors = append(c.Spec.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: e}})
		}
		return c
	}
	tests := []struct {
		name    string
		class   *resourceapi.DeviceClass
		refused string // a substring of the message; empty: admitted
	}{
		{name: "a second class of our driver", class: class("vgpu-h200", `device.driver == "vgpu.dra.dev" && device.attributes["vgpu.dra.dev"].productName == "H200"`),
			refused: `DeviceClass "vgpu-h200" has the selector`},
		{name: "single quotes", class: class("mine", `device.driver == 'vgpu.dra.dev'`), refused: `names vgpu-dra's driver "vgpu.dra.dev"`},
		{name: "our attributes only", class: class("mine", `device.attributes["vgpu.dra.dev"].uuid != ""`), refused: `DeviceClass "mine"`},
		{name: "in a second selector", class: class("mine", `device.capacity["x"].memory > 0`, `device.driver in ["a.example.com", "vgpu.dra.dev"]`), refused: `DeviceClass "mine"`},
		{name: "no selectors", class: class("everything"), refused: `DeviceClass "everything" has no selectors`},
		{name: "negative: ours", class: class("vgpu.dra.dev", `device.driver == "vgpu.dra.dev"`)},
		{name: "negative: a compute class of ours", class: class(testBestEffortClass, `device.driver == "vgpu.dra.dev"`)},
		{name: "negative: another driver", class: class("gpu.nvidia.com", `device.driver == "gpu.nvidia.com"`)},
		{name: "negative: a driver whose name extends ours", class: class("x", `device.driver == "vgpu.dra.dev.example.com"`)},
	}
	rv := newTestReviewer(testRules, fakeSpecs{})
	for _, tt := range tests {
		for _, op := range []admissionv1.Operation{admissionv1.Create, admissionv1.Update} {
			t.Run(tt.name+"/"+string(op), func(t *testing.T) {
				a := admission{kind: "DeviceClass", op: op, obj: tt.class}
				if op == admissionv1.Update {
					a.old = class(tt.class.Name, `device.driver == "gpu.example.com"`)
				}
				resp := admit(t, rv, PathValidateDeviceClasses, a)
				switch {
				case tt.refused == "" && !resp.Allowed:
					t.Errorf("refused: %+v", resp.Result)
				case tt.refused != "" && (resp.Allowed || resp.Result == nil):
					t.Errorf("admitted")
				case tt.refused != "":
					for _, want := range []string{tt.refused, `ask for DeviceClass "vgpu.dra.dev" or "best-effort.vgpu.dra.dev"`} {
						if !strings.Contains(resp.Result.Message, want) {
							t.Errorf("message %q lacks %q", resp.Result.Message, want)
						}
					}
				}
			})
		}
	}
}
