// Package v1alpha1 is the claim configuration of vgpu-dra: the opaque device configuration
// for driver vgpu.dra.dev that a ResourceClaim or its DeviceClass carries (contract §17).
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group, the driver's name.
const GroupName = "vgpu.dra.dev"

// Version is this package's API version.
const Version = "v1alpha1"

// Kind is the configuration's kind.
const Kind = "VGPUConfig"

// SchemeGroupVersion is the group and version of the types in this package.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: Version}

// Class is how a share is served when other shares on its GPU have work.
type Class string

const (
	// Guaranteed shares get their cores whenever they have work.
	Guaranteed Class = "Guaranteed"
	// BestEffort shares use what guaranteed shares leave idle.
	BestEffort Class = "BestEffort"
)

// VGPUConfig is the configuration of a vGPU share.
type VGPUConfig struct {
	metav1.TypeMeta `json:",inline"`
	// Class is Guaranteed (the default) or BestEffort.
	Class Class `json:"class,omitempty"`
	// CoresCeiling, in percent, is how far the share may burst above its cores request when
	// the GPU has idle time; between the request and 100. Absent: no burst.
	CoresCeiling *int64 `json:"coresCeiling,omitempty"`
}

// DeepCopyObject implements runtime.Object.
func (c *VGPUConfig) DeepCopyObject() runtime.Object {
	if c == nil {
		return nil
	}
	out := *c
	if c.CoresCeiling != nil {
		v := *c.CoresCeiling
		out.CoresCeiling = &v
	}
	return &out
}

// Default fills the defaults: class Guaranteed.
func (c *VGPUConfig) Default() {
	if c.Class == "" {
		c.Class = Guaranteed
	}
}

// Ceiling is the share's effective ceiling for a cores request: CoresCeiling, or the request
// when absent.
func (c *VGPUConfig) Ceiling(cores int64) int64 {
	if c.CoresCeiling == nil {
		return cores
	}
	return *c.CoresCeiling
}
