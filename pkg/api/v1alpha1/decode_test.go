package v1alpha1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

var params = field.NewPath("spec", "devices", "config").Index(0).Child("opaque", "parameters")

func TestDecodeDefaultsClassGuaranteed(t *testing.T) {
	c, err := Decode([]byte(`{"apiVersion":"vgpu.dra.dev/v1alpha1","kind":"VGPUConfig"}`), params)
	if err != nil {
		t.Fatal(err)
	}
	if c.Class != Guaranteed || c.CoresCeiling != nil || c.Ceiling(30) != 30 {
		t.Fatalf("got %+v, want class Guaranteed and no ceiling", c)
	}
}

func TestDecodeYAMLWithCeiling(t *testing.T) {
	c, err := Decode([]byte("apiVersion: vgpu.dra.dev/v1alpha1\nkind: VGPUConfig\nclass: BestEffort\ncoresCeiling: 80\n"), params)
	if err != nil {
		t.Fatal(err)
	}
	if c.Class != BestEffort || c.Ceiling(30) != 80 {
		t.Fatalf("got %+v", c)
	}
}

func TestDecodeErrorsNameTheField(t *testing.T) {
	for name, tc := range map[string]struct{ doc, want string }{
		"unknown field":  {`{"apiVersion":"vgpu.dra.dev/v1alpha1","kind":"VGPUConfig","cores":50}`, `unknown field "cores"`},
		"wrong version":  {`{"apiVersion":"vgpu.dra.dev/v1","kind":"VGPUConfig"}`, params.Child("apiVersion").String()},
		"wrong kind":     {`{"apiVersion":"vgpu.dra.dev/v1alpha1","kind":"GpuConfig"}`, params.Child("apiVersion").String()},
		"no kind":        {`{"apiVersion":"vgpu.dra.dev/v1alpha1"}`, params.String()},
		"wrong type":     {`{"apiVersion":"vgpu.dra.dev/v1alpha1","kind":"VGPUConfig","coresCeiling":"high"}`, params.String()},
		"duplicate":      {`{"apiVersion":"vgpu.dra.dev/v1alpha1","kind":"VGPUConfig","class":"BestEffort","class":"Guaranteed"}`, `duplicate field "class"`},
		"not a document": {`[`, params.String()},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Decode([]byte(tc.doc), params)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func ceiling(v int64) *int64 { return &v }

func TestValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg   VGPUConfig
		cores int64
		want  string // "" = valid
	}{
		"guaranteed no ceiling":    {VGPUConfig{Class: Guaranteed}, 30, ""},
		"best effort ceiling 100":  {VGPUConfig{Class: BestEffort, CoresCeiling: ceiling(100)}, 30, ""},
		"ceiling equal to request": {VGPUConfig{Class: Guaranteed, CoresCeiling: ceiling(30)}, 30, ""},
		"unknown class":            {VGPUConfig{Class: "Burstable"}, 30, params.Child("class").String() + `: Unsupported value: "Burstable"`},
		"ceiling above 100":        {VGPUConfig{Class: Guaranteed, CoresCeiling: ceiling(101)}, 30, params.Child("coresCeiling").String() + ": Invalid value: 101: must be at most 100"},
		"ceiling below request":    {VGPUConfig{Class: Guaranteed, CoresCeiling: ceiling(20)}, 30, params.Child("coresCeiling").String() + ": Invalid value: 20: must be at least the cores request 30"},
		"whole GPU request is 100": {VGPUConfig{Class: Guaranteed, CoresCeiling: ceiling(90)}, 0, "must be at least the cores request 100"},
		"negative ceiling":         {VGPUConfig{Class: Guaranteed, CoresCeiling: ceiling(-1)}, 30, params.Child("coresCeiling").String()},
	} {
		t.Run(name, func(t *testing.T) {
			errs := Validate(&tc.cfg, tc.cores, params)
			if tc.want == "" {
				if len(errs) != 0 {
					t.Fatalf("errors %v, want none", errs)
				}
				return
			}
			if len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.want) {
				t.Fatalf("errors %v, want one containing %q", errs, tc.want)
			}
		})
	}
}
