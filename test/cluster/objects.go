package cluster

import (
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ClaimFor is a ResourceClaim in namespace ns for a share of one vGPU (one request, "gpu").
func ClaimFor(ns, name, memory string, cores int64) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{ShareRequest("gpu", memory, cores)},
		}},
	}
}

// ShareRequest is one request of a share of a vGPU: memory (a quantity) and cores (percent).
func ShareRequest(name, memory string, cores int64) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: DriverName,
		Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			"memory": resource.MustParse(memory), "cores": *resource.NewQuantity(cores, resource.DecimalSI),
		}},
	}}
}

// VGPUPod runs the test workload in namespace ns with the claim (none when claim is empty) in
// its one container "app". It carries no annotation: the chart's webhook adds the
// required-plugins annotation (contract §1, §12), as it does for users' pods. The default
// command sleeps until SIGTERM.
func VGPUPod(ns, name, claim string, command ...string) *corev1.Pod {
	if len(command) == 0 {
		command = []string{"sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"}
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: Ptr[int64](1),
			RestartPolicy:                 corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "app", Image: WorkloadImage, ImagePullPolicy: corev1.PullNever, Command: command,
			}},
		},
	}
	if claim != "" {
		p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}}
	}
	return p
}

// Ptr returns a pointer to v.
func Ptr[T any](v T) *T { return &v }
