package webhook

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// ReasonToolkitEnv is the refusal, under Rules.RefuseToolkitEnv, of a container that names GPUs
// for the NVIDIA Container Toolkit in its env.
const ReasonToolkitEnv = "toolkit_env"

// toolkitDeviceEnv are the variables through which a container asks the NVIDIA Container
// Toolkit for devices (NVIDIA_DRIVER_CAPABILITIES and the like only shape what it mounts).
var toolkitDeviceEnv = []string{"NVIDIA_VISIBLE_DEVICES", "NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES", "NVIDIA_IMEX_CHANNELS"}

// toolkitEnvRules refuses every unprivileged container of the pod (init, app and ephemeral)
// that sets one of toolkitDeviceEnv to anything but "void" or "none" (which ask for no device):
// where the toolkit honours the variable from unprivileged containers — which
// --gpu-injection=env needs (contract §3, "env") — such a container gets the GPUs it names
// with no claim and no limit. vGPU containers too: with cdi injection nothing of ours replaces
// the pod's value. A privileged container, or one that adds SYS_ADMIN, is left alone: the
// toolkit honours the variable there whatever its configuration, and such a container reaches
// every device anyway. envFrom cannot be seen at admission, nor can an image's env.
func toolkitEnvRules(pod *corev1.Pod) []Violation {
	var out []Violation
	check := func(kind, name string, env []corev1.EnvVar, sc *corev1.SecurityContext) {
		if privilegedForToolkit(sc) {
			return
		}
		var set []string
		for _, e := range env {
			if slices.Contains(toolkitDeviceEnv, e.Name) && (e.ValueFrom != nil || (e.Value != "void" && e.Value != "none")) &&
				!slices.Contains(set, e.Name) {
				set = append(set, e.Name)
			}
		}
		if len(set) == 0 {
			return
		}
		out = append(out, Violation{ReasonToolkitEnv, fmt.Sprintf(
			"%s %q sets %s in its env: this cluster refuses it, because the NVIDIA Container Toolkit would give the "+
				"container the GPUs it names, outside any claim and its limits; ask for a vGPU with a ResourceClaim of "+
				"the vGPU DeviceClass instead, or set it to void", kind, name, strings.Join(set, ", "))})
	}
	for _, c := range pod.Spec.InitContainers {
		check("init container", c.Name, c.Env, c.SecurityContext)
	}
	for _, c := range pod.Spec.Containers {
		check("container", c.Name, c.Env, c.SecurityContext)
	}
	for _, c := range pod.Spec.EphemeralContainers {
		check("ephemeral container", c.Name, c.Env, c.SecurityContext)
	}
	return out
}

// privilegedForToolkit: the toolkit counts a container as privileged when it holds
// CAP_SYS_ADMIN.
func privilegedForToolkit(sc *corev1.SecurityContext) bool {
	if sc == nil {
		return false
	}
	if sc.Privileged != nil && *sc.Privileged {
		return true
	}
	return sc.Capabilities != nil && slices.ContainsFunc(sc.Capabilities.Add, func(c corev1.Capability) bool {
		return c == "SYS_ADMIN" || c == "CAP_SYS_ADMIN" || c == "ALL"
	})
}
