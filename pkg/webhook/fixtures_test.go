package webhook

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Builders of the objects the rule tests review. Everything is in namespace "ns".

const (
	testClass  = "vgpu.dra.dev"
	otherClass = "other.example.com"
	// testBestEffortClass is a compute class's DeviceClass: ours too.
	testBestEffortClass = "best-effort.vgpu.dra.dev"
	testExtended        = corev1.ResourceName("vgpu.dra.dev/vgpu")
	testUUID            = "vgpu.dra.dev/uuid"
)

var testSelection = Selection{DeviceClasses: []string{testClass, testBestEffortClass}, ExtendedResource: testExtended}

var testRules = Rules{Selection: testSelection, Driver: testClass, UUIDAttribute: testUUID, RequiredPlugin: testClass}

// fakeSpecs serves claim and template specs from maps keyed "ns/name".
type fakeSpecs struct {
	claims, templates map[string]*resourceapi.ResourceClaimSpec
}

func (f fakeSpecs) ClaimSpec(_ context.Context, ns, name string) (*resourceapi.ResourceClaimSpec, error) {
	if s, ok := f.claims[ns+"/"+name]; ok {
		return s, nil
	}
	return nil, fmt.Errorf("ResourceClaim %s/%s: %w", ns, name, ErrNotFound)
}

func (f fakeSpecs) TemplateSpec(_ context.Context, ns, name string) (*resourceapi.ResourceClaimSpec, error) {
	if s, ok := f.templates[ns+"/"+name]; ok {
		return s, nil
	}
	return nil, fmt.Errorf("ResourceClaimTemplate %s/%s: %w", ns, name, ErrNotFound)
}

// request is an exactly request of class for count devices, with optional memory and cores.
func request(name, class string, count int64, memory, cores string) resourceapi.DeviceRequest {
	r := resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count,
	}}
	r.Exactly.Capacity = capacity(memory, cores)
	return r
}

func capacity(memory, cores string) *resourceapi.CapacityRequirements {
	if memory == "" && cores == "" {
		return nil
	}
	c := &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
	if memory != "" {
		c.Requests["memory"] = resource.MustParse(memory)
	}
	if cores != "" {
		c.Requests["cores"] = resource.MustParse(cores)
	}
	return c
}

// firstAvailable is a request whose subrequests are tried in order.
func firstAvailable(name string, subs ...resourceapi.DeviceSubRequest) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: name, FirstAvailable: subs}
}

func subrequest(name, class string, count int64, memory string) resourceapi.DeviceSubRequest {
	return resourceapi.DeviceSubRequest{Name: name, DeviceClassName: class,
		AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count, Capacity: capacity(memory, "")}
}

// spec is a claim spec with these requests and constraints.
func spec(requests []resourceapi.DeviceRequest, constraints ...resourceapi.DeviceConstraint) *resourceapi.ResourceClaimSpec {
	return &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: requests, Constraints: constraints}}
}

func distinct(attribute string, requests ...string) resourceapi.DeviceConstraint {
	return resourceapi.DeviceConstraint{Requests: requests, DistinctAttribute: ptr.To(resourceapi.FullyQualifiedName(attribute))}
}

// podClaim is an entry of pod.spec.resourceClaims naming a claim, or a template when template.
func podClaim(name, object string, template bool) corev1.PodResourceClaim {
	if template {
		return corev1.PodResourceClaim{Name: name, ResourceClaimTemplateName: ptr.To(object)}
	}
	return corev1.PodResourceClaim{Name: name, ResourceClaimName: ptr.To(object)}
}

// container refers to pod claims; "claim/request" names one request of it.
func container(name string, refs ...string) corev1.Container {
	c := corev1.Container{Name: name, Image: "busybox"}
	for _, ref := range refs {
		claim, req, _ := cutSlash(ref)
		c.Resources.Claims = append(c.Resources.Claims, corev1.ResourceClaim{Name: claim, Request: req})
	}
	return c
}

func cutSlash(s string) (string, string, bool) {
	for i := range s {
		if s[i] == '/' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// withExtended gives the container n of the extended resource in its limits.
func withExtended(c corev1.Container, n int64) corev1.Container {
	c.Resources.Limits = corev1.ResourceList{testExtended: *resource.NewQuantity(n, resource.DecimalSI)}
	return c
}

func withEnv(c corev1.Container, names ...string) corev1.Container {
	for _, n := range names {
		c.Env = append(c.Env, corev1.EnvVar{Name: n, Value: "x"})
	}
	return c
}

func pod(claims []corev1.PodResourceClaim, containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"},
		Spec:       corev1.PodSpec{ResourceClaims: claims, Containers: containers},
	}
}
