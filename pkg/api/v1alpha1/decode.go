package v1alpha1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

var (
	scheme  = newScheme()
	decoder = serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
)

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	s.AddKnownTypes(SchemeGroupVersion, &VGPUConfig{})
	return s
}

// Decode reads a VGPUConfig from JSON or YAML strictly: an unknown or duplicated field, or an
// apiVersion/kind other than vgpu.dra.dev/v1alpha1 VGPUConfig, is an error under path. The
// result is defaulted but not validated (see Validate).
func Decode(data []byte, path *field.Path) (*VGPUConfig, error) {
	obj, gvk, err := decoder.Decode(data, nil, nil)
	if err != nil {
		if gvk != nil && gvk.Kind != "" && (gvk.GroupVersion() != SchemeGroupVersion || gvk.Kind != Kind) {
			return nil, field.Invalid(path.Child("apiVersion"), gvk.GroupVersion().String()+", kind "+gvk.Kind,
				fmt.Sprintf("must be %s, kind %s", SchemeGroupVersion, Kind))
		}
		return nil, field.Invalid(path, "", err.Error())
	}
	cfg, ok := obj.(*VGPUConfig)
	if !ok {
		return nil, field.Invalid(path.Child("kind"), gvk.Kind, "must be "+Kind)
	}
	cfg.Default()
	return cfg, nil
}

// Validate checks a defaulted config against the claim's consumed cores request (0: the whole
// GPU, 100); each error names its field under path.
func Validate(c *VGPUConfig, cores int64, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch c.Class {
	case Guaranteed, BestEffort:
	default:
		errs = append(errs, field.NotSupported(path.Child("class"), c.Class, []Class{Guaranteed, BestEffort}))
	}
	if c.CoresCeiling != nil {
		request := cores
		if request == 0 {
			request = 100
		}
		p := path.Child("coresCeiling")
		switch v := *c.CoresCeiling; {
		case v > 100:
			errs = append(errs, field.Invalid(p, v, "must be at most 100"))
		case v < request:
			errs = append(errs, field.Invalid(p, v, fmt.Sprintf("must be at least the cores request %d", request)))
		}
	}
	return errs
}
