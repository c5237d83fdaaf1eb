package webhook

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
)

// Selection says which devices are ours: requests for our DeviceClasses, and the main
// DeviceClass's extended resource (the scheduler makes that claim itself).
type Selection struct {
	// DeviceClasses are the DeviceClasses of vGPU requests: the main one first ("vgpu.dra.dev"),
	// then the compute classes' ("guaranteed.vgpu.dra.dev", "best-effort.vgpu.dra.dev"; contract
	// §17), which select the same devices and carry a VGPUConfig.
	DeviceClasses []string
	// ExtendedResource is the main class's extended resource ("vgpu.dra.dev/vgpu").
	ExtendedResource corev1.ResourceName
}

// isOurClass reports whether a DeviceClass name is one of ours.
func (sel Selection) isOurClass(name string) bool {
	return slices.Contains(sel.DeviceClasses, name)
}

// mainClass is the DeviceClass that messages tell users to ask for.
func (sel Selection) mainClass() string {
	if len(sel.DeviceClasses) == 0 {
		return ""
	}
	return sel.DeviceClasses[0]
}

// isOurs reports whether a request can be served by our classes: an exactly request for one, or
// a firstAvailable request with a subrequest for one (the scheduler may pick that one).
func (sel Selection) isOurs(r resourceapi.DeviceRequest) bool {
	if r.Exactly != nil {
		return sel.isOurClass(r.Exactly.DeviceClassName)
	}
	return slices.ContainsFunc(r.FirstAvailable, func(s resourceapi.DeviceSubRequest) bool {
		return sel.isOurClass(s.DeviceClassName)
	})
}

// claimUse is one claim through which a container gets vGPUs.
type claimUse struct {
	// podClaim is the entry of pod.spec.resourceClaims; empty for the extended resource.
	podClaim string
	// object names where the spec comes from, for messages: `ResourceClaim "ns/name"`.
	object string
	// spec is the claim's spec; nil for the extended resource.
	spec *resourceapi.ResourceClaimSpec
	// requests are the vGPU requests of the claim that the container gets.
	requests []resourceapi.DeviceRequest
}

// String names the claim the way a user wrote it.
func (c claimUse) String() string {
	if c.podClaim == "" {
		return c.object
	}
	return fmt.Sprintf("pod claim %q (%s)", c.podClaim, c.object)
}

// requestNames lists the names of the claim's vGPU requests that the container gets.
func (c claimUse) requestNames() []string {
	names := make([]string, len(c.requests))
	for i, r := range c.requests {
		names[i] = r.Name
	}
	return names
}

// containerUse is a container that uses a vGPU, with the claims it gets them through.
type containerUse struct {
	container *corev1.Container
	init      bool
	claims    []claimUse
}

// describe names the container the way messages do.
func (u containerUse) describe() string {
	if u.init {
		return fmt.Sprintf("init container %q", u.container.Name)
	}
	return fmt.Sprintf("container %q", u.container.Name)
}

// MissingClaimError says that a pod references a ResourceClaim or ResourceClaimTemplate that
// does not exist: the webhook cannot tell whether its containers need the vGPU guard.
type MissingClaimError struct {
	// PodClaim is the entry of pod.spec.resourceClaims.
	PodClaim string
	// Kind is "ResourceClaim" or "ResourceClaimTemplate"; Name is "namespace/name".
	Kind, Name string
	// Containers are the containers that reference the pod claim.
	Containers []string
}

// Error says what is missing and how to fix it. Helm creates the kinds it does not know, such as
// ResourceClaims and templates, after the Pods of a chart, so a chart with a bare Pod and its
// claim always meets this refusal; the message says the two ways out (contract §12).
func (e *MissingClaimError) Error() string {
	return fmt.Sprintf("pod claim %q names %s %q, which does not exist: vgpu-webhook must see it to know whether "+
		"container(s) %s need the vGPU guard; create the %s before the pod (Helm creates ResourceClaims and "+
		"ResourceClaimTemplates after Pods: put the pod in a Deployment, StatefulSet or Job, whose controller "+
		"creates it again once the %s exists, or create the %s in a pre-install hook)",
		e.PodClaim, e.Kind, e.Name, strings.Join(quoteAll(e.Containers), ", "), e.Kind, e.Kind, e.Kind)
}

// podUses returns the containers of the pod that use a vGPU (init containers first), each with
// the claims and requests it uses. Only the pod claims that some container references are
// looked up; one that does not exist is a *MissingClaimError. namespace is the request's (a pod
// being created may not carry one yet).
func podUses(ctx context.Context, specs Specs, sel Selection, namespace string, pod *corev1.Pod) ([]containerUse, error) {
	resolved := map[string]*resolvedClaim{}
	missing := map[string]*MissingClaimError{} // each looked up (and waited for) once
	var missingOrder []error
	var uses []containerUse
	visit := func(c *corev1.Container, init bool) error {
		u := containerUse{container: c, init: init}
		for _, ref := range c.Resources.Claims {
			if m, ok := missing[ref.Name]; ok {
				if !slices.Contains(m.Containers, c.Name) {
					m.Containers = append(m.Containers, c.Name)
				}
				continue
			}
			rc, err := resolveClaim(ctx, specs, namespace, pod, ref.Name, resolved)
			if err != nil {
				var m *MissingClaimError
				if errors.As(err, &m) {
					m.Containers = append(m.Containers, c.Name)
					missing[ref.Name] = m
					missingOrder = append(missingOrder, m)
					continue
				}
				return err
			}
			if rc == nil {
				continue // not a pod claim; the API server refuses the pod
			}
			addRequests(&u, rc, ref.Request, sel)
		}
		if usesExtendedResource(c, sel.ExtendedResource) {
			u.claims = append(u.claims, claimUse{object: fmt.Sprintf("the extended resource %q", sel.ExtendedResource)})
		}
		if len(u.claims) > 0 {
			uses = append(uses, u)
		}
		return nil
	}
	for i := range pod.Spec.InitContainers {
		if err := visit(&pod.Spec.InitContainers[i], true); err != nil {
			return nil, err
		}
	}
	for i := range pod.Spec.Containers {
		if err := visit(&pod.Spec.Containers[i], false); err != nil {
			return nil, err
		}
	}
	if len(missingOrder) > 0 {
		return nil, errors.Join(missingOrder...)
	}
	return uses, nil
}

// resolvedClaim is a pod claim with its spec.
type resolvedClaim struct {
	podClaim string
	object   string
	spec     *resourceapi.ResourceClaimSpec
}

// resolveClaim looks the pod claim up once per review. It returns nil, nil for a name that is
// not in pod.spec.resourceClaims.
func resolveClaim(ctx context.Context, specs Specs, namespace string, pod *corev1.Pod, name string, resolved map[string]*resolvedClaim) (*resolvedClaim, error) {
	if rc, ok := resolved[name]; ok {
		return rc, nil
	}
	i := slices.IndexFunc(pod.Spec.ResourceClaims, func(p corev1.PodResourceClaim) bool { return p.Name == name })
	if i < 0 {
		return nil, nil
	}
	pc := pod.Spec.ResourceClaims[i]
	rc := resolvedClaim{podClaim: name}
	var kind, objName string
	var err error
	switch {
	case pc.ResourceClaimName != nil:
		kind, objName = "ResourceClaim", *pc.ResourceClaimName
		rc.spec, err = specs.ClaimSpec(ctx, namespace, objName)
	case pc.ResourceClaimTemplateName != nil:
		kind, objName = "ResourceClaimTemplate", *pc.ResourceClaimTemplateName
		rc.spec, err = specs.TemplateSpec(ctx, namespace, objName)
	default:
		return nil, nil // neither set: the API server refuses the pod
	}
	rc.object = fmt.Sprintf("%s %q", kind, namespace+"/"+objName)
	if errors.Is(err, ErrNotFound) {
		return nil, &MissingClaimError{PodClaim: name, Kind: kind, Name: namespace + "/" + objName}
	}
	if err != nil {
		return nil, fmt.Errorf("look up %s of pod claim %q: %w", rc.object, name, err)
	}
	resolved[name] = &rc
	return &rc, nil
}

// addRequests records the claim's vGPU requests that a container reference gives the
// container: the named one, or every one when the reference names none. A container that
// references one claim twice (two requests) gets one claimUse with both.
func addRequests(u *containerUse, rc *resolvedClaim, request string, sel Selection) {
	var got []resourceapi.DeviceRequest
	for _, r := range rc.spec.Devices.Requests {
		if sel.isOurs(r) && (request == "" || r.Name == request) {
			got = append(got, r)
		}
	}
	if len(got) == 0 {
		return
	}
	// Keyed by pod claim: two pod claims made from one template are two claims at run time.
	i := slices.IndexFunc(u.claims, func(c claimUse) bool { return c.podClaim == rc.podClaim })
	if i < 0 {
		u.claims = append(u.claims, claimUse{podClaim: rc.podClaim, object: rc.object, spec: rc.spec})
		i = len(u.claims) - 1
	}
	for _, r := range got {
		if !slices.ContainsFunc(u.claims[i].requests, func(have resourceapi.DeviceRequest) bool { return have.Name == r.Name }) {
			u.claims[i].requests = append(u.claims[i].requests, r)
		}
	}
}

// usesExtendedResource reports whether the container asks for the extended resource (in limits,
// or in requests, which the API server defaults from limits).
func usesExtendedResource(c *corev1.Container, name corev1.ResourceName) bool {
	if name == "" {
		return false
	}
	_, inLimits := c.Resources.Limits[name]
	_, inRequests := c.Resources.Requests[name]
	return inLimits || inRequests
}

func quoteAll(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = fmt.Sprintf("%q", v)
	}
	return out
}
