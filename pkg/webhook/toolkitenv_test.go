package webhook

import (
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// TestRefuseToolkitEnv: with the option, a container that names GPUs for the NVIDIA Container
// Toolkit in its env is refused, naming it and the variable, whether or not its pod uses a vGPU;
// values that ask for no device, other NVIDIA_* variables and privileged containers pass; and
// without the option nothing is refused.
func TestRefuseToolkitEnv(t *testing.T) {
	withValue := func(c corev1.Container, name, value string) corev1.Container {
		c.Env = append(c.Env, corev1.EnvVar{Name: name, Value: value})
		return c
	}
	with := func(c corev1.Container, sc *corev1.SecurityContext) corev1.Container {
		c.SecurityContext = sc
		return c
	}
	vgpuClaims := []corev1.PodResourceClaim{podClaim("gpu", "one", false)}
	fromRef := container("app")
	fromRef.Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", ValueFrom: &corev1.EnvVarSource{
		ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "m"}, Key: "k"}}}}
	tests := []struct {
		name string
		pod  *corev1.Pod
		want string // a substring of the refusal; empty: admitted
	}{
		{name: "a pod without a vGPU", pod: pod(nil, withValue(container("app"), "NVIDIA_VISIBLE_DEVICES", "all")),
			want: `container "app" sets NVIDIA_VISIBLE_DEVICES in its env`},
		{name: "an init container", pod: withInit(pod(nil, container("app")), withValue(container("setup"), "NVIDIA_VISIBLE_DEVICES", "0")),
			want: `init container "setup" sets NVIDIA_VISIBLE_DEVICES`},
		{name: "a vGPU container", pod: pod(vgpuClaims, withValue(container("app", "gpu"), "NVIDIA_VISIBLE_DEVICES", "all")),
			want: `container "app" sets NVIDIA_VISIBLE_DEVICES`},
		{name: "a value from a ConfigMap", pod: pod(nil, fromRef), want: `container "app" sets NVIDIA_VISIBLE_DEVICES`},
		{name: "MIG and IMEX variables", pod: pod(nil, withValue(withValue(container("app"), "NVIDIA_MIG_MONITOR_DEVICES", "all"), "NVIDIA_IMEX_CHANNELS", "0")),
			want: "NVIDIA_MIG_MONITOR_DEVICES, NVIDIA_IMEX_CHANNELS"},
		{name: "negative: void", pod: pod(nil, withValue(container("app"), "NVIDIA_VISIBLE_DEVICES", "void"))},
		{name: "negative: none", pod: pod(nil, withValue(container("app"), "NVIDIA_VISIBLE_DEVICES", "none"))},
		{name: "negative: driver capabilities", pod: pod(nil, withValue(container("app"), "NVIDIA_DRIVER_CAPABILITIES", "all"))},
		{name: "negative: privileged", pod: pod(nil, with(withValue(container("app"), "NVIDIA_VISIBLE_DEVICES", "all"), &corev1.SecurityContext{Privileged: ptr.To(true)}))},
		{name: "negative: SYS_ADMIN", pod: pod(nil, with(withValue(container("app"), "NVIDIA_VISIBLE_DEVICES", "all"),
			&corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}}))},
	}
	on := testRules
	on.RefuseToolkitEnv = true
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := admit(t, newTestReviewer(on, specsForRules), PathValidatePods, admission{kind: "Pod", obj: tt.pod})
			switch {
			case tt.want == "" && !resp.Allowed:
				t.Errorf("refused: %+v", resp.Result)
			case tt.want != "" && (resp.Allowed || resp.Result == nil):
				t.Errorf("admitted")
			case tt.want != "" && !strings.Contains(resp.Result.Message, tt.want):
				t.Errorf("message %q lacks %q", resp.Result.Message, tt.want)
			}
			if off := admit(t, newTestReviewer(testRules, specsForRules), PathValidatePods, admission{kind: "Pod", obj: tt.pod}); !off.Allowed {
				t.Errorf("refused without the option: %+v", off.Result)
			}
		})
	}

	debug := pod(nil, container("app"))
	debug.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
		Name: "debugger", Env: []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}}}}
	resp := admit(t, newTestReviewer(on, specsForRules), PathValidatePods,
		admission{kind: "Pod", op: admissionv1.Update, subResource: "ephemeralcontainers", obj: debug, old: pod(nil, container("app"))})
	if resp.Allowed || !strings.Contains(resp.Result.Message, `ephemeral container "debugger" sets NVIDIA_VISIBLE_DEVICES`) {
		t.Errorf("an ephemeral container with the variable: %+v", resp.Result)
	}
}
