package webhook

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// Annotations the API's own controllers put on the claims they make.
const (
	// annotationPodClaimName is on a claim the resourceclaim controller made from a template
	// for the pod claim it names; the claim's controller is the pod.
	annotationPodClaimName = "resource.kubernetes.io/pod-claim-name"
	// annotationExtendedResource is on the claim the scheduler makes for a pod's extended
	// resource; its requests come from the pod, which was reviewed with them.
	annotationExtendedResource = "resource.kubernetes.io/extended-resource-name"
)

// ReasonUnguardedPod is the refusal of a claim that would give a vGPU to a container admitted
// without the required-plugins annotation.
const ReasonUnguardedPod = "unguarded_pod"

// Pods reads the pods that a claim being created is for.
type Pods interface {
	// Pod returns the pod, or nil when it does not exist.
	Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	// ReferencingClaim returns the pods of the namespace whose spec.resourceClaims name the
	// ResourceClaim.
	ReferencingClaim(ctx context.Context, namespace, claim string) ([]corev1.Pod, error)
}

// recheckPods applies the pod rules again, with this claim's spec, to the pods already admitted
// that will use the claim being created (contract §12, "Claims replaced after their pod"). A
// claim or template can be deleted and created again under its name, with another spec,
// between a pod's admission and its allocation: the pod was judged with the old spec. The pods
// are the claim's owner for a claim made from a template (made when its pod already exists,
// from the template as it is then), else the pods of the namespace that name it.
func (r *Reviewer) recheckPods(ctx context.Context, namespace string, c *resourceapi.ResourceClaim) ([]Violation, error) {
	if r.pods == nil {
		return nil, nil
	}
	overlay := overlaySpecs{base: r.specs}
	var pods []corev1.Pod
	owner := metav1.GetControllerOf(c)
	podClaim, fromTemplate := c.Annotations[annotationPodClaimName]
	switch _, extended := c.Annotations[annotationExtendedResource]; {
	case extended:
		return nil, nil
	case fromTemplate && owner != nil && owner.Kind == "Pod":
		p, err := r.pods.Pod(ctx, namespace, owner.Name)
		if err != nil {
			return nil, fmt.Errorf("get pod %s, which the claim is made for: %w", klog.KRef(namespace, owner.Name), err)
		}
		if p == nil || p.UID != owner.UID {
			return nil, nil // gone; the garbage collector removes the claim
		}
		i := slices.IndexFunc(p.Spec.ResourceClaims, func(pc corev1.PodResourceClaim) bool { return pc.Name == podClaim })
		if i < 0 || p.Spec.ResourceClaims[i].ResourceClaimTemplateName == nil {
			return nil, nil
		}
		overlay.templates = map[string]*resourceapi.ResourceClaimSpec{*p.Spec.ResourceClaims[i].ResourceClaimTemplateName: &c.Spec}
		pods = []corev1.Pod{*p}
	case c.Name != "":
		var err error
		if pods, err = r.pods.ReferencingClaim(ctx, namespace, c.Name); err != nil {
			return nil, fmt.Errorf("list the pods that name the claim: %w", err)
		}
		overlay.claims = map[string]*resourceapi.ResourceClaimSpec{c.Name: &c.Spec}
	}
	var out []Violation
	for i := range pods {
		vs, err := r.recheckPod(ctx, namespace, &pods[i], overlay)
		if err != nil {
			return nil, err
		}
		out = append(out, vs...)
	}
	return out, nil
}

// recheckPod applies the pod rules and the container policy to an admitted pod with the specs
// of overlay, and refuses a container that would use a vGPU without the annotation the
// mutating webhook gives such containers.
func (r *Reviewer) recheckPod(ctx context.Context, namespace string, pod *corev1.Pod, overlay overlaySpecs) ([]Violation, error) {
	if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil, nil
	}
	uses, err := podUses(withoutWait(ctx), overlay, r.rules.Selection, namespace, pod)
	if err != nil {
		return nil, err
	}
	vs := podRules(uses, r.rules.UUIDAttribute)
	refusals, _ := policyRules(cmp.Or(r.rules.ContainerPolicy, PolicyAudit), pod, uses)
	vs = append(vs, refusals...)
	set, err := requiredPluginsAnnotations(pod, uses, r.rules.RequiredPlugin)
	var ae *annotationError
	var ne *containerNameError
	switch {
	case errors.As(err, &ae):
		vs = append(vs, Violation{ReasonInvalidAnnotation, ae.Error()})
	case errors.As(err, &ne):
		vs = append(vs, Violation{ReasonContainerName, ne.Error()})
	case err != nil:
		return nil, err
	case len(set) > 0:
		var names []string
		for _, u := range uses {
			if _, ok := set[annotationKey(u.container.Name)]; ok {
				names = append(names, u.describe())
			}
		}
		vs = append(vs, Violation{ReasonUnguardedPod, fmt.Sprintf("%s would get a vGPU from it but the pod has no "+
			"required-plugins annotation for it (it used no vGPU when the pod was admitted)", strings.Join(names, " and "))})
	}
	for i := range vs {
		vs[i].Message = fmt.Sprintf("pod %q uses this claim and was admitted with another spec of it, and with this one: %s "+
			"(create the claim with the spec the pod was admitted with, or delete the pod and create it again)",
			namespace+"/"+pod.Name, vs[i].Message)
	}
	return vs, nil
}

// overlaySpecs serves the specs of the claim being created in place of what the pod was admitted
// with, and the rest from base, without waiting: a claim that does not exist asks for nothing
// (its own creation is reviewed in turn).
type overlaySpecs struct {
	base              Specs
	claims, templates map[string]*resourceapi.ResourceClaimSpec
}

// ClaimSpec implements Specs.
func (o overlaySpecs) ClaimSpec(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaimSpec, error) {
	if s, ok := o.claims[name]; ok {
		return s, nil
	}
	return orNothing(o.base.ClaimSpec(ctx, namespace, name))
}

// TemplateSpec implements Specs.
func (o overlaySpecs) TemplateSpec(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaimSpec, error) {
	if s, ok := o.templates[name]; ok {
		return s, nil
	}
	return orNothing(o.base.TemplateSpec(ctx, namespace, name))
}

func orNothing(s *resourceapi.ResourceClaimSpec, err error) (*resourceapi.ResourceClaimSpec, error) {
	if errors.Is(err, ErrNotFound) {
		return &resourceapi.ResourceClaimSpec{}, nil
	}
	return s, err
}
