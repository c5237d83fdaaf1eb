package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// ReasonGuardRemoved is the refusal of a pod UPDATE that takes the required-plugins guard away
// from a container.
const ReasonGuardRemoved = "guard_removed"

// updatePod reviews a pod UPDATE: an ephemeral container joining the pod (validatePod), or any
// other update, which must keep the required-plugins guard of every container that had it.
// Pod annotations are mutable, and the kubelet hands the current ones to the runtime whenever
// it creates a container, a restarted one too: an annotation removed after admission would let
// a vGPU container come back without the NRI plugin.
func (r *Reviewer) updatePod(ctx context.Context, req *admissionv1.AdmissionRequest) outcome {
	switch req.SubResource {
	case "ephemeralcontainers":
		return r.validatePod(ctx, req)
	case "":
	default:
		return outcome{} // status and the other subresources carry no annotations
	}
	if r.rules.RequiredPlugin == "" {
		return outcome{}
	}
	var pod, old corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return outcome{err: fmt.Errorf("decode the pod: %w", err)}
	}
	if err := json.Unmarshal(req.OldObject.Raw, &old); err != nil {
		return outcome{err: fmt.Errorf("decode the pod before the update: %w", err)}
	}
	return outcome{violations: guardRules(&old, &pod, r.rules.RequiredPlugin)}
}

// guardRules refuses an update after which a container whose required-plugins list (the one
// containerd applies to it, effectiveAnnotation) named plugin no longer names it: the key
// removed, its value changed, or a more specific key added without it. It needs no claim: the
// old object says which containers the webhook guarded, so a pod whose claim is gone can still
// be updated (a finalizer removed) as long as it keeps its guard.
func guardRules(old, pod *corev1.Pod, plugin string) []Violation {
	var lost []string
	var key string
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		if !guarded(old.Annotations, c.Name, plugin) || guarded(pod.Annotations, c.Name, plugin) {
			continue
		}
		lost = append(lost, c.Name)
		if key == "" {
			key, _, _ = effectiveAnnotation(old.Annotations, c.Name)
		}
	}
	if len(lost) == 0 {
		return nil
	}
	return []Violation{{ReasonGuardRemoved, fmt.Sprintf(
		"the update takes the required-plugins guard away from container(s) %s: before it their annotation (%q) named "+
			"the NRI plugin %q, after it their list does not; a container created again (a restart) would then start "+
			"without vgpu-dra's limits while the plugin is not running. Keep the annotation; a change must keep %q in the list",
		strings.Join(quoteAll(lost), ", "), key, plugin, plugin)}}
}

// guarded reports whether the required-plugins list that containerd applies to the container
// names plugin; a list that does not parse names nothing.
func guarded(annotations map[string]string, container, plugin string) bool {
	_, value, ok := effectiveAnnotation(annotations, container)
	if !ok {
		return false
	}
	var list []string
	return yaml.Unmarshal([]byte(value), &list) == nil && slices.Contains(list, plugin)
}
