package webhook

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// patchOperation is one JSON Patch (RFC 6902) operation.
type patchOperation struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// annotationError says that a required-plugins annotation already on the pod is not a list of
// plugin names: containerd would refuse every container it applies to.
type annotationError struct {
	key, value string
	err        error
}

func (e *annotationError) Error() string {
	return fmt.Sprintf("annotation %q is %q, not a list of NRI plugin names (containerd would refuse the container: %v); "+
		"write it as a JSON list such as [\"vgpu.dra.dev\"], or remove it", e.key, e.value, e.err)
}

// containerNameError says that a vGPU container's name is too long for its required-plugins
// annotation key: the key's name part, "container.<name>", may have at most 63 characters, so the
// API server would refuse the pod with a message about an annotation the user never wrote.
type containerNameError struct {
	describe, key, plugin string
	problems              []string
}

func (e *containerNameError) Error() string {
	return fmt.Sprintf("%s uses a vGPU, and its name is too long for the annotation that guards it: the key %q is not "+
		"a valid annotation key (%s); give the container a name of at most %d characters, or annotate the pod "+
		"with %s: '[%q]' (it then guards every container of the pod)",
		e.describe, e.key, strings.Join(e.problems, "; "), maxGuardedContainerName, contract.RequiredPluginsPodAnnotation, e.plugin)
}

// maxGuardedContainerName is the longest container name whose container key is a valid
// annotation key: 63 characters for "container.<name>".
const maxGuardedContainerName = 63 - len("container.")

// requiredPluginsAnnotations returns the annotations to set so that every container in uses
// requires plugin (contract §1): key → value. containerd's default validator takes a container's
// list from the first of its container key, the pod key and the bare key that is present, so a
// container whose list already names the plugin is left alone, and one whose list does not gets
// its container key set to that list plus the plugin: annotations already present keep their
// effect. A list that does not parse is an *annotationError; a container whose key would not be a
// valid annotation key (a name over 53 characters) is a *containerNameError.
func requiredPluginsAnnotations(pod *corev1.Pod, uses []containerUse, plugin string) (map[string]string, error) {
	if plugin == "" {
		return nil, nil
	}
	set := map[string]string{}
	for _, u := range uses {
		key := annotationKey(u.container.Name)
		from, value, ok := effectiveAnnotation(pod.Annotations, u.container.Name)
		var list []string
		if ok {
			if err := yaml.Unmarshal([]byte(value), &list); err != nil {
				return nil, &annotationError{key: from, value: value, err: err}
			}
		}
		if slices.Contains(list, plugin) {
			continue
		}
		if problems := validation.IsQualifiedName(key); len(problems) > 0 {
			return nil, &containerNameError{describe: u.describe(), key: key, plugin: plugin, problems: problems}
		}
		b, err := json.Marshal(append(list, plugin))
		if err != nil {
			return nil, fmt.Errorf("encode the required-plugins list of container %q: %w", u.container.Name, err)
		}
		set[key] = string(b)
	}
	return set, nil
}

// annotationKey is the container's required-plugins key.
func annotationKey(container string) string {
	return contract.RequiredPluginsAnnotationPrefix + container
}

// effectiveAnnotation returns the required-plugins annotation that containerd applies to the
// container, with its key.
func effectiveAnnotation(annotations map[string]string, container string) (key, value string, ok bool) {
	for _, k := range []string{contract.RequiredPluginsAnnotationPrefix + container,
		contract.RequiredPluginsPodAnnotation, contract.RequiredPluginsAnnotationBase} {
		if v, found := annotations[k]; found {
			return k, v, true
		}
	}
	return "", "", false
}

// annotationPatch turns annotations to set into JSON Patch operations on the pod.
func annotationPatch(pod *corev1.Pod, set map[string]string) []patchOperation {
	if len(set) == 0 {
		return nil
	}
	if pod.Annotations == nil {
		return []patchOperation{{Op: "add", Path: "/metadata/annotations", Value: set}}
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	ops := make([]patchOperation, 0, len(keys))
	for _, k := range keys {
		// "add" on an existing member replaces it (RFC 6902 §4.1).
		ops = append(ops, patchOperation{Op: "add", Path: "/metadata/annotations/" + escapePointer(k), Value: set[k]})
	}
	return ops
}

// escapePointer escapes a JSON Pointer (RFC 6901) reference token.
func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}
