//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// helmTestPod is the chart's `helm test` pod (templates/tests/node-check.yaml).
const helmTestPod = release + "-test"

var helmTestPassed = regexp.MustCompile(`(?m)^Phase:\s+Succeeded$`)

// TestHelmTest: `helm test` of the installed chart passes on the node — its pod's claim of the
// DeviceClass is allocated and prepared, the container gets the claim's limits in its env and
// in a read-only vgpu.config, registers with the plugin, and libvgpu.so grants the whole limit
// and refuses 1 MiB more — and it passes again (the kept pod is replaced). A test claim that no
// GPU can hold makes it fail instead of passing.
func TestHelmTest(t *testing.T) {
	installChart(t)
	ctx := context.Background()

	start := time.Now()
	out := mustRun(t, "helm", "test", release, "--namespace", pluginNS, "--logs", "--timeout", "1m")
	t.Logf("helm test passed in %v:\n%s", time.Since(start).Round(100*time.Millisecond), out)
	if !helmTestPassed.MatchString(out) {
		t.Errorf("helm test printed no \"Phase: Succeeded\":\n%s", out)
	}
	for _, want := range []string{
		"ok: the claim's limits are in the env: 256 MiB and 10% of GPU-",
		"ok: /etc/vgpu-dra/config/vgpu.config holds the same limits and is read-only",
		"ok: registered with the node's plugin",
		"ok: libvgpu.so granted 256 MiB and refused 1 MiB more (CUDA_ERROR_OUT_OF_MEMORY)",
		"PASS",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the test pod's log (helm test --logs) lacks %q", want)
		}
	}
	first, err := kube.CoreV1().Pods(pluginNS).Get(ctx, helmTestPod, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the test pod after its run (kept for its logs): %v", err)
	}

	start = time.Now()
	out = mustRun(t, "helm", "test", release, "--namespace", pluginNS, "--timeout", "1m")
	t.Logf("helm test again in %v", time.Since(start).Round(100*time.Millisecond))
	again, err := kube.CoreV1().Pods(pluginNS).Get(ctx, helmTestPod, metav1.GetOptions{})
	if err != nil || again.UID == first.UID || !helmTestPassed.MatchString(out) {
		t.Errorf("the second helm test: pod %v (first %s), err %v:\n%s", again.UID, first.UID, err, out)
	}
	deleteHelmTestPod(t)

	// A claim of 1 TiB: no GPU has it, the pod stays Pending, and helm test fails at its timeout.
	installChart(t, "--set", "tests.memoryMiB=1048576")
	defer installChart(t) // the chart as the other tests expect it, with the default test claim
	defer deleteHelmTestPod(t)
	start = time.Now()
	out, err = run(t, "helm", "test", release, "--namespace", pluginNS, "--timeout", "10s")
	t.Logf("helm test of a claim no GPU holds: %v after %v:\n%s", err, time.Since(start).Round(100*time.Millisecond), out)
	if err == nil || helmTestPassed.MatchString(out) {
		t.Fatalf("helm test passed with a claim of 1 TiB:\n%s", out)
	}
	eventually(t, 30*time.Second, "the scheduler to report the test pod unschedulable", func() (bool, error) {
		p, err := kube.CoreV1().Pods(pluginNS).Get(ctx, helmTestPod, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return true, nil
			}
		}
		return false, fmt.Errorf("phase %s, conditions %+v", p.Status.Phase, p.Status.Conditions)
	})
}

// deleteHelmTestPod deletes the test pod that helm test keeps (the next run would replace it;
// an uninstall would leave it), and waits until the kubelet has unprepared its claim.
func deleteHelmTestPod(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	p, err := kube.CoreV1().Pods(pluginNS).Get(ctx, helmTestPod, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	var claimUID string
	if s := p.Status.ResourceClaimStatuses; len(s) > 0 && s[0].ResourceClaimName != nil {
		if c, err := kube.ResourceV1().ResourceClaims(pluginNS).Get(ctx, *s[0].ResourceClaimName, metav1.GetOptions{}); err == nil {
			claimUID = string(c.UID)
		}
	}
	if err := kube.CoreV1().Pods(pluginNS).Delete(ctx, helmTestPod, metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](0)}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	eventually(t, defaultTimeout, "the test pod gone", func() (bool, error) {
		_, err := kube.CoreV1().Pods(pluginNS).Get(ctx, helmTestPod, metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
	if claimUID == "" {
		return // no claim was made for it yet
	}
	eventually(t, defaultTimeout, "the test pod's claim deleted and unprepared", func() (bool, error) {
		list, err := kube.ResourceV1().ResourceClaims(pluginNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range list.Items {
			if string(c.UID) == claimUID {
				return false, fmt.Errorf("claim %s still there", c.Name)
			}
		}
		for _, path := range []string{"/var/run/cdi/" + driverName + "-claim_" + claimUID + ".json", "/var/lib/vgpu-dra/claims/" + claimUID} {
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				return false, fmt.Errorf("%s still there (%v)", path, err)
			}
		}
		return true, nil
	})
}
