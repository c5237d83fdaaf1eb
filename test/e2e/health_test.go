//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/test/cluster"
)

// healthOnTheExtendedResourcePath is what a user who asked for `vgpu.dra.dev/vgpu: 1` sees when
// the GPU fails and recovers. Kubernetes 1.37 does not show DRA device health in the status of
// such a pod (kubernetes/kubernetes#139939: allocatedResourcesStatus stays empty for the
// extended-resource path), so the plugin says it twice itself (contract §3, "Claim device
// status"): a Warning event on the pod and Healthy=False in the claim's device status, then a
// Normal event and Healthy=True once the GPU recovers. Run by TestDRAFeatures while both
// simulated GPUs are free (the pod takes one whole).
func healthOnTheExtendedResourcePath(t *testing.T, gpus []string) {
	ctx := context.Background()
	const name = "ext-health"
	p := cluster.VGPUPod(featNS, name, "")
	p.Spec.Containers[0].Resources.Limits = extendedResourceLimits(1)
	createFeatPod(t, p)
	defer deleteFeatPodAndClaim(t, name)
	waitFeatRunning(t, name)
	pod, err := kube.CoreV1().Pods(featNS).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Status.ExtendedResourceClaimStatus == nil {
		t.Fatalf("no extended resource claim in the pod's status: %+v", pod.Status)
	}
	claimName := pod.Status.ExtendedResourceClaimStatus.ResourceClaimName
	claim, err := kube.ResourceV1().ResourceClaims(featNS).Get(ctx, claimName, metav1.GetOptions{})
	if err != nil || claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("the pod's claim %s: %+v %v", claimName, claim, err)
	}
	device := claim.Status.Allocation.Devices.Results[0].Device
	index, err := strconv.Atoi(strings.TrimPrefix(device, "gpu-"))
	if err != nil || index >= len(gpus) {
		t.Fatalf("allocated device %q is none of the simulated GPUs %v", device, gpus)
	}
	uuid := gpus[index]
	waitClaimHealthy(t, claimName, device, metav1.ConditionTrue, contract.DeviceReasonGPUHealthy)

	controlPOST(t, "/gpus/"+uuid+"/xid/92")
	// Whatever happens below, the GPU is healthy again for the subtests that follow.
	defer func() {
		if resp, err := controlClient().Post("http://localhost/gpus/"+uuid+"/healthy", "text/plain", nil); err == nil {
			resp.Body.Close()
		}
	}()
	waitTaint(t, device, true)
	warning := waitPluginEventOfType(t, featNS, name, corev1.EventTypeWarning, contract.EventReasonDeviceUnhealthy, uuid)
	for _, want := range []string{"XID 92", "delete it"} {
		if !strings.Contains(warning.Message, want) {
			t.Errorf("the Warning event's message %q lacks %q", warning.Message, want)
		}
	}
	cond := waitClaimHealthy(t, claimName, device, metav1.ConditionFalse, contract.DeviceReasonGPUUnhealthy)
	if !strings.Contains(cond.Message, uuid) || !strings.Contains(cond.Message, "XID 92") {
		t.Errorf("Healthy=False message %q, want the GPU and the XID", cond.Message)
	}
	if p, _ := kube.CoreV1().Pods(featNS).Get(ctx, name, metav1.GetOptions{}); len(p.Status.ContainerStatuses) > 0 {
		t.Logf("the pod's allocatedResourcesStatus while the GPU is unhealthy (kubernetes/kubernetes#139939): %+v",
			p.Status.ContainerStatuses[0].AllocatedResourcesStatus)
	}

	controlPOST(t, "/gpus/"+uuid+"/recovery-action/1") // a reset is needed
	controlPOST(t, "/gpus/"+uuid+"/recovery-action/0") // and done
	waitTaint(t, device, false)
	waitPluginEventOfType(t, featNS, name, corev1.EventTypeNormal, contract.EventReasonDeviceRecovered, uuid)
	waitClaimHealthy(t, claimName, device, metav1.ConditionTrue, contract.DeviceReasonGPUHealthy)
	if n := pluginEventCount(t, featNS, name, contract.EventReasonDeviceUnhealthy); n != 1 {
		t.Errorf("%s raised %d times on the pod, want once for the one transition", contract.EventReasonDeviceUnhealthy, n)
	}
	if p, _ := kube.CoreV1().Pods(featNS).Get(ctx, name, metav1.GetOptions{}); p.Status.Phase != corev1.PodRunning {
		t.Errorf("the pod is %s after a NoSchedule fault and its recovery", p.Status.Phase)
	}
}

// waitClaimHealthy waits until the claim's entry of this driver for device has a Healthy
// condition with this status and reason, and returns it.
func waitClaimHealthy(t *testing.T, claim, device string, status metav1.ConditionStatus, reason string) metav1.Condition {
	t.Helper()
	var out metav1.Condition
	eventually(t, defaultTimeout, fmt.Sprintf("claim %s Healthy=%s %s", claim, status, reason), func() (bool, error) {
		c, err := kube.ResourceV1().ResourceClaims(featNS).Get(context.Background(), claim, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, d := range c.Status.Devices {
			if d.Driver != driverName || d.Device != device {
				continue
			}
			for _, cond := range d.Conditions {
				if cond.Type == contract.DeviceConditionHealthy && cond.Status == status && cond.Reason == reason {
					out = cond
					return true, nil
				}
			}
		}
		return false, fmt.Errorf("status.devices %+v", c.Status.Devices)
	})
	return out
}

// waitPluginEventOfType waits for the kubelet plugin's event of this type and reason on the
// pod whose message contains text, and returns it.
func waitPluginEventOfType(t *testing.T, ns, pod, eventType, reason, text string) corev1.Event {
	t.Helper()
	var out corev1.Event
	eventually(t, defaultTimeout, fmt.Sprintf("%s event %s on %s", eventType, reason, pod), func() (bool, error) {
		l, err := kube.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false, err
		}
		for _, e := range l.Items {
			if e.Reason == reason && e.Type == eventType && e.Source.Component == "vgpu-dra-kubelet-plugin" && strings.Contains(e.Message, text) {
				t.Logf("event on %s: %s %s %s", pod, e.Type, e.Reason, e.Message)
				out = e
				return true, nil
			}
		}
		return false, fmt.Errorf("%d events on %s, none %s %s", len(l.Items), pod, eventType, reason)
	})
	return out
}

// pluginEventCount is how many times the kubelet plugin raised events of this reason on the pod
// (a repeat is counted on the same event object).
func pluginEventCount(t *testing.T, ns, pod, reason string) int32 {
	t.Helper()
	l, err := kube.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
	if err != nil {
		t.Fatal(err)
	}
	var n int32
	for _, e := range l.Items {
		if e.Reason == reason && e.Source.Component == "vgpu-dra-kubelet-plugin" {
			n += max(e.Count, 1)
		}
	}
	return n
}

// deleteFeatPodAndClaim deletes the pod and waits until its extended-resource claim, which the
// scheduler made for it, is gone from the API server and unprepared on the node (its CDI spec
// removed): the GPU is free for the next subtest, whose Prepare would otherwise find it
// overcommitted and wait for the kubelet's back-off.
func deleteFeatPodAndClaim(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	var uids []string
	if l, err := kube.ResourceV1().ResourceClaims(featNS).List(ctx, metav1.ListOptions{}); err == nil {
		for _, c := range l.Items {
			if isClaimOf(c, name) {
				uids = append(uids, string(c.UID))
			}
		}
	}
	defer func() {
		eventually(t, defaultTimeout, "the claims of pod "+name+" unprepared on the node", func() (bool, error) {
			for _, uid := range uids {
				if specs, _ := filepathGlob("/var/run/cdi/" + driverName + "-claim_" + uid + ".json"); len(specs) > 0 {
					return false, fmt.Errorf("CDI spec %v still there", specs)
				}
			}
			return true, nil
		})
	}()
	zero := metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](0)}
	if err := kube.CoreV1().Pods(featNS).Delete(ctx, name, zero); err != nil && !apierrors.IsNotFound(err) {
		t.Error(err)
	}
	eventually(t, defaultTimeout, "pod "+name+" and its claim gone", func() (bool, error) {
		if _, err := kube.CoreV1().Pods(featNS).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("pod still there (%v)", err)
		}
		l, err := kube.ResourceV1().ResourceClaims(featNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range l.Items {
			if isClaimOf(c, name) {
				return false, fmt.Errorf("claim %s still there", c.Name)
			}
		}
		return true, nil
	})
}

func isClaimOf(c resourceapi.ResourceClaim, pod string) bool {
	for _, o := range c.OwnerReferences {
		if o.Kind == "Pod" && o.Name == pod {
			return true
		}
	}
	return false
}
