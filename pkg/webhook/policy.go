package webhook

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
)

// ContainerPolicy is what a vGPU container must be (--container-policy, chart value
// webhook.containerPolicy; contract §12, threat-model.md). It is defence in depth: the wall is
// the node's enforcer (contract §15), which a tenant who gets past admission still meets.
type ContainerPolicy string

const (
	// PolicyAudit admits every vGPU container and warns (kubectl prints the admission warning)
	// about each that runs as root on a writable root file system: such a container can rename
	// /etc/vgpu-dra or /etc away and run without libvgpu.so, and only the enforcer holds it.
	// The default: most CUDA images run as root and write to their root file system, and
	// refusing them would break every such workload on install.
	PolicyAudit ContainerPolicy = "audit"
	// PolicyReadOnlyRoot refuses a vGPU container without readOnlyRootFilesystem: the rename
	// of the library's parent directories then fails with EROFS.
	PolicyReadOnlyRoot ContainerPolicy = "require-readonly-root"
	// PolicyNonRoot refuses a vGPU container that may run as root (neither runAsNonRoot nor a
	// non-zero runAsUser, on the container or the pod): a non-root user cannot rename the
	// root-owned /etc.
	PolicyNonRoot ContainerPolicy = "require-non-root"
)

// ReasonContainerPolicy is the refusal of a container the policy does not allow; and
// ReasonEphemeralContainer of an ephemeral container added to a vGPU pod.
const (
	ReasonContainerPolicy    = "container_policy"
	ReasonEphemeralContainer = "ephemeral_container"
)

// ParseContainerPolicy parses the flag's value.
func ParseContainerPolicy(s string) (ContainerPolicy, error) {
	switch p := ContainerPolicy(s); p {
	case PolicyAudit, PolicyReadOnlyRoot, PolicyNonRoot:
		return p, nil
	}
	return "", fmt.Errorf("%q: want %s, %s or %s", s, PolicyAudit, PolicyReadOnlyRoot, PolicyNonRoot)
}

// policyRules applies the policy to the pod's vGPU containers: the refusals under a require-
// policy, the warnings under audit.
func policyRules(policy ContainerPolicy, pod *corev1.Pod, uses []containerUse) (refusals []Violation, warnings []string) {
	for _, u := range uses {
		readOnly := readOnlyRoot(u.container)
		nonRoot := mayNotRunAsRoot(pod, u.container)
		switch {
		case policy == PolicyReadOnlyRoot && !readOnly:
			refusals = append(refusals, Violation{ReasonContainerPolicy, fmt.Sprintf(
				"%s uses a vGPU and its root file system is writable: this cluster requires vGPU containers to set "+
					"securityContext.readOnlyRootFilesystem: true (a writable root lets the container rename the vGPU "+
					"library's directories away); set it, with an emptyDir for the paths the program writes",
				u.describe())})
		case policy == PolicyNonRoot && !nonRoot:
			refusals = append(refusals, Violation{ReasonContainerPolicy, fmt.Sprintf(
				"%s uses a vGPU and may run as root: this cluster requires vGPU containers to run as non-root "+
					"(securityContext.runAsNonRoot: true or a non-zero runAsUser, on the container or the pod)",
				u.describe())})
		case policy == PolicyAudit && !readOnly && !nonRoot:
			warnings = append(warnings, fmt.Sprintf(
				"vgpu-dra: %s uses a vGPU as root on a writable root file system: it can unload the vGPU library; "+
					"the node still holds it to its claim, killing its processes past the limit "+
					"(set readOnlyRootFilesystem or runAsNonRoot to stop it in the container)", u.describe()))
		}
	}
	return refusals, warnings
}

// ephemeralRules decides about ephemeral containers added to a pod with vGPU containers: a root
// ephemeral container shares the pod's process namespace views and can rename the library's
// paths through /proc/<pid>/root. Refused under a require- policy, warned about under audit.
func ephemeralRules(policy ContainerPolicy, pod *corev1.Pod, uses []containerUse) (refusals []Violation, warnings []string) {
	if len(uses) == 0 || len(pod.Spec.EphemeralContainers) == 0 {
		return nil, nil
	}
	var names []string
	for _, e := range pod.Spec.EphemeralContainers {
		names = append(names, e.Name)
	}
	msg := fmt.Sprintf("ephemeral container(s) %q in a pod with vGPU containers: one that runs as root can rename the "+
		"vGPU library's paths through /proc/<pid>/root", names)
	if policy == PolicyAudit {
		return nil, []string{"vgpu-dra: " + msg + "; the node still holds the pod's containers to their claims"}
	}
	return []Violation{{ReasonEphemeralContainer, msg + fmt.Sprintf("; this cluster's vGPU container policy (%s) does not allow them", policy)}}, nil
}

func readOnlyRoot(c *corev1.Container) bool {
	return c.SecurityContext != nil && c.SecurityContext.ReadOnlyRootFilesystem != nil && *c.SecurityContext.ReadOnlyRootFilesystem
}

// mayNotRunAsRoot: the container's (else the pod's) runAsNonRoot is true, or its effective
// runAsUser is set and not 0.
func mayNotRunAsRoot(pod *corev1.Pod, c *corev1.Container) bool {
	var nonRoot *bool
	var user *int64
	if ps := pod.Spec.SecurityContext; ps != nil {
		nonRoot, user = ps.RunAsNonRoot, ps.RunAsUser
	}
	if cs := c.SecurityContext; cs != nil {
		if cs.RunAsNonRoot != nil {
			nonRoot = cs.RunAsNonRoot
		}
		if cs.RunAsUser != nil {
			user = cs.RunAsUser
		}
	}
	if user != nil {
		return *user != 0
	}
	return nonRoot != nil && *nonRoot
}
