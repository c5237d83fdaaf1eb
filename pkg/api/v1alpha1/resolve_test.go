package v1alpha1

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func opaque(src resourceapi.AllocationConfigSource, driver, params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{Source: src, Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(params)}}}}
}

const head = `{"apiVersion":"vgpu.dra.dev/v1alpha1","kind":"VGPUConfig",`

func TestForRequestClaimOverridesClass(t *testing.T) {
	configs := []resourceapi.DeviceAllocationConfiguration{
		opaque(resourceapi.AllocationConfigSourceClaim, GroupName, head+`"class":"BestEffort","coresCeiling":90}`),
		opaque(resourceapi.AllocationConfigSourceClass, GroupName, head+`"class":"Guaranteed"}`),
		opaque(resourceapi.AllocationConfigSourceClaim, "other.dev", `not ours`),
	}
	c, err := ForRequest(configs, "gpu", 30)
	if err != nil {
		t.Fatal(err)
	}
	if c.Class != BestEffort || c.Ceiling(30) != 90 {
		t.Fatalf("got %+v, want the claim's BestEffort ceiling 90", c)
	}
}

func TestForRequestRequestsScopeTheEntry(t *testing.T) {
	configs := []resourceapi.DeviceAllocationConfiguration{
		opaque(resourceapi.AllocationConfigSourceClass, GroupName, head+`"class":"Guaranteed"}`),
		opaque(resourceapi.AllocationConfigSourceClaim, GroupName, head+`"class":"BestEffort"}`, "batch"),
	}
	for request, want := range map[string]Class{"serve": Guaranteed, "batch": BestEffort, "batch/small": BestEffort} {
		c, err := ForRequest(configs, request, 30)
		if err != nil || c.Class != want {
			t.Fatalf("request %s: got %+v, %v; want %s", request, c, err, want)
		}
	}
}

func TestForRequestNoConfigIsDefault(t *testing.T) {
	c, err := ForRequest(nil, "gpu", 30)
	if err != nil || c.Class != Guaranteed || c.CoresCeiling != nil {
		t.Fatalf("got %+v, %v", c, err)
	}
}

func TestForRequestErrorNamesTheEntry(t *testing.T) {
	configs := []resourceapi.DeviceAllocationConfiguration{
		opaque(resourceapi.AllocationConfigSourceClass, "other.dev", `{}`),
		opaque(resourceapi.AllocationConfigSourceClaim, GroupName, head+`"coresCeiling":20}`),
	}
	_, err := ForRequest(configs, "gpu", 30)
	want := "status.allocation.devices.config[1].opaque.parameters.coresCeiling"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v, want one naming %s", err, want)
	}
}
