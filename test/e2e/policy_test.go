//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestContainerPolicy: the webhook's vGPU container policy (contract §12), admission as defence
// in depth in front of the node's enforcer. Under the default, audit, a root container on a
// writable root file system is admitted and kubectl prints the webhook's warning, as does
// kubectl debug on a vGPU pod; under require-readonly-root such a container is refused with
// the fix, one that sets readOnlyRootFilesystem is admitted, and an ephemeral container is
// refused in a vGPU pod.
func TestContainerPolicy(t *testing.T) {
	installChart(t)
	ensureNamespace(t)
	ctx := context.Background()
	createClaim(t, claimFor("policy", "1Gi", 10))
	defer cleanupShares(t, []obsShare{{name: "policy"}})
	manifest := `apiVersion: v1
kind: Pod
metadata: {name: policy, namespace: ` + testNS + `}
spec:
  terminationGracePeriodSeconds: 1
  restartPolicy: Never
  containers:
  - name: app
    image: ` + workloadImage + `
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
    resources: {claims: [{name: gpu}]}
  resourceClaims: [{name: gpu, resourceClaimName: policy}]
`
	out, err := kubectlApply(t, manifest)
	if err != nil || !strings.Contains(out, `Warning: vgpu-dra: container "app" uses a vGPU as root on a writable root file system`) {
		t.Fatalf("kubectl apply under audit: %v\n%s\nwant the pod created with the webhook's warning", err, out)
	}
	waitRunning(t, "policy")
	debug := func() (string, error) {
		return run(t, "kubectl", "debug", "-n", testNS, "policy", "--image="+workloadImage, "--image-pull-policy=Never", "-c", "debugger", "--", "sleep", "60")
	}
	if out, err := debug(); err != nil || !strings.Contains(out, "/proc/<pid>/root") {
		t.Errorf("kubectl debug under audit: %v\n%s\nwant the ephemeral container added with the webhook's warning", err, out)
	}

	installChart(t, "--set", "webhook.containerPolicy=require-readonly-root")
	defer installChart(t)
	p := vgpuPod("policy-2", "policy")
	_, err = dryRunCreate(ctx, testNS, p)
	if err == nil || !strings.Contains(err.Error(), `container "app" uses a vGPU and its root file system is writable`) || !strings.Contains(err.Error(), "readOnlyRootFilesystem: true") {
		t.Errorf("a writable root under require-readonly-root: %v, want the refusal with the fix", err)
	}
	ro := true
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{ReadOnlyRootFilesystem: &ro}
	if _, err := dryRunCreate(ctx, testNS, p); err != nil {
		t.Errorf("a read-only root under require-readonly-root: %v", err)
	}
	if out, err := run(t, "kubectl", "debug", "-n", testNS, "policy", "--image="+workloadImage, "--image-pull-policy=Never", "-c", "debugger2", "--", "sleep", "60"); err == nil || !strings.Contains(out, "does not allow them") {
		t.Errorf("kubectl debug under require-readonly-root: %v\n%s\nwant the refusal", err, out)
	}
	got, err := kube.CoreV1().Pods(testNS).Get(ctx, "policy", metav1.GetOptions{})
	if err != nil || len(got.Spec.EphemeralContainers) != 1 {
		t.Errorf("ephemeral containers after the refusal: %v (%v), want only the one added under audit", got.Spec.EphemeralContainers, err)
	}
}
