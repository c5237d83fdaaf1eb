//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/vgpu-dra/vgpu-dra/pkg/clusterview"
)

// exampleChecks says, for each manifest of deployments/examples/*.yaml, what a user who applies
// it sees once its pods run: each runs for real (runExamples) on the two simulated H200s of
// TestDRAFeatures, one file at a time, so each has the whole node. A new example without a check
// here fails the test. deployments/examples/device-plugin/ is make demo MODE=device-plugin's,
// which checks what it shows and runs in .ci/run.
var exampleChecks = map[string]func(t *testing.T, ns string, gpus []string){
	// The monitor sees a GPU with no limits ("0 0") in its vgpu.config.
	"admin-access.yaml": func(t *testing.T, ns string, gpus []string) {
		expectLog(t, ns, "gpu-monitor", "monitor", `(?m)^gpu 0 (`+strings.Join(gpus, "|")+`) 0 0$`)
	},
	// The kubelet reports the claim's device Healthy in the pod's status.
	"health.yaml": func(t *testing.T, ns string, _ []string) {
		waitDeviceHealthIn(t, ns, "health-watch", "gpu", "Healthy")
	},
	// Each container sees two GPUs, each with its own limits: 8Gi and 4Gi.
	"multi-gpu.yaml": func(t *testing.T, ns string, _ []string) {
		for _, ctr := range []string{"a", "b"} {
			lines := gpuLines(podLog(t, ns, "two-gpus", ctr))
			if len(lines) != 2 || lines[0][1] == lines[1][1] {
				t.Errorf("container %s: gpu lines %v, want two different GPUs", ctr, lines)
				continue
			}
			if got := lines[0][2] + " " + lines[1][2]; got != fmt.Sprint(8<<30, " ", 4<<30) && got != fmt.Sprint(4<<30, " ", 8<<30) {
				t.Errorf("container %s: memory limits %s, want 8Gi and 4Gi", ctr, got)
			}
		}
	},
	// Both GPUs are free: the first choice, 40Gi and 50 %, is taken.
	"prioritized-list.yaml": func(t *testing.T, ns string, _ []string) {
		expectLog(t, ns, "train", "app", `(?m)^CUDA_CORE_LIMIT_0=50$`)
		expectLog(t, ns, "train", "app", `(?m)^CUDA_MEM_LIMIT_0=40960m$`)
	},
	// Two shares of the compute classes (contract §16, §17): each container prints the allowance
	// the node's arbiter gives it (its request: nothing runs on the GPU), the claims' device
	// status says each share's class and ceiling, and the plugin's arbiter takes serve's wakes.
	"compute-classes.yaml": func(t *testing.T, ns string, _ []string) {
		expectLog(t, ns, "serve", "app", `(?m)^gpu GPU-\S+ 30$`)
		expectLog(t, ns, "batch", "app", `(?m)^gpu GPU-\S+ 20$`)
		for pod, want := range map[string]map[string]any{
			"serve": {"class": "Guaranteed", "coresCeiling": 60.0, "cores": 30.0},
			"batch": {"class": "BestEffort", "coresCeiling": 100.0, "cores": 20.0}, // best-effort bursts to the whole GPU
		} {
			data := podClaimStatusData(t, ns, pod)
			for k, v := range want {
				if data[k] != v {
					t.Errorf("%s's claim: device status %s = %v, want %v (%v)", pod, k, data[k], v, data)
				}
			}
		}
		// kubectl vgpu shows the same, from the claims' status.
		var list struct{ Items []clusterview.PodShare }
		if err := json.Unmarshal([]byte(kubectlVGPU(t, "pods", "-n", ns, "-o", "json")), &list); err != nil {
			t.Fatalf("kubectl vgpu pods -o json: %v", err)
		}
		got := map[string]string{}
		for _, p := range list.Items {
			got[p.Pod] = fmt.Sprintf("%s %d", p.Class, p.CoresCeiling)
		}
		if got["serve"] != "Guaranteed 60" || got["batch"] != "BestEffort 100" {
			t.Errorf("kubectl vgpu pods: class and ceiling %v, want serve Guaranteed 60, batch BestEffort 100", got)
		}
		// The per-container metrics: class, ceiling and the arbiter's allowance.
		metricsTarget := net.JoinHostPort(pluginPodIP(t), "8080")
		for pod, want := range map[string][3]float64{"serve": {30, 60, 30}, "batch": {20, 100, 20}} {
			labels := map[string]string{"namespace": ns, "pod": pod, "container": "app"}
			eventually(t, defaultTimeout, pod+"'s compute series on /metrics", func() (bool, error) {
				m, err := scrapeMetrics(metricsTarget)
				if err != nil {
					return false, err
				}
				for i, name := range []string{"vgpu_dra_container_cores_limit_percent", "vgpu_dra_container_cores_ceiling_percent", "vgpu_dra_container_cores_allowance_percent"} {
					if v, ok := seriesValue(m, name, labels); !ok || v != want[i] {
						return false, fmt.Errorf("%s%v = %v (present %v), want %v", name, labels, v, ok, want[i])
					}
				}
				return true, nil
			})
		}
		taken := func() float64 {
			m, err := scrapeMetrics(metricsTarget)
			if err != nil {
				t.Fatal(err)
			}
			v, _ := seriesValue(m, "vgpu_dra_arbiter_wakes_total", map[string]string{"result": "taken"})
			return v
		}
		before := taken()
		eventually(t, defaultTimeout, "the arbiter to take serve's wakes", func() (bool, error) {
			v := taken()
			return v > before, fmt.Errorf("arbiter_wakes_total{result=taken} %v, %v before", v, before)
		})
	},
	// Two pods, each with its own claim of 10Gi and 30 %.
	"shared-gpu.yaml": func(t *testing.T, ns string, _ []string) {
		uids := map[string]bool{}
		for _, pod := range []string{"share-a", "share-b"} {
			expectLog(t, ns, pod, "app", `(?m)^CUDA_MEM_LIMIT_0=10240m$`)
			expectLog(t, ns, pod, "app", `(?m)^CUDA_CORE_LIMIT_0=30$`)
			if m := regexp.MustCompile(`(?m)^MANAGER_VGPU_CLAIM_UID=(\S+)$`).FindStringSubmatch(podLog(t, ns, pod, "app")); m != nil {
				uids[m[1]] = true
			}
		}
		if len(uids) != 2 {
			t.Errorf("claim UIDs of share-a and share-b: %v, want two different ones", uids)
		}
	},
}

// runExamples applies each example as a user would (its claims, then its pods, in a namespace of
// its own that allows admin access), waits for every pod to run, checks what exampleChecks says,
// and removes the namespace, waiting until the plugin has unprepared its claims.
func runExamples(t *testing.T, gpus []string) {
	files, err := filepath.Glob(filepath.Join(repoRoot, "deployments", "examples", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("examples: %v %v", files, err)
	}
	for _, f := range files {
		name := filepath.Base(f)
		check, ok := exampleChecks[name]
		if !ok {
			t.Errorf("%s: no check in exampleChecks: say what a user sees when it runs", name)
			continue
		}
		t.Run(strings.TrimSuffix(name, ".yaml"), func(t *testing.T) {
			ns := "vgpu-e2e-ex-" + strings.TrimSuffix(name, ".yaml")
			pods := applyExample(t, f, ns)
			for _, p := range pods {
				waitRunningIn(t, ns, p, defaultTimeout)
			}
			check(t, ns, gpus)
		})
	}
}

// applyExample creates the objects of one example file in namespace ns (its Namespaces left
// out) and returns the names of its pods; a cleanup deletes the namespace and waits until every
// claim of the file is unprepared on the node.
func applyExample(t *testing.T, file, ns string) []string {
	t.Helper()
	ctx := context.Background()
	nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{resourceapi.DRAAdminNamespaceLabelKey: "true"}}}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, nsObj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteExampleNamespace(t, ns) })
	content, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var pods []corev1.Pod
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(content), 4096)
	for {
		var raw runtime.RawExtension
		if err := dec.Decode(&raw); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		var meta metav1.TypeMeta
		mustUnmarshal(t, raw.Raw, &meta)
		switch meta.Kind {
		case "Namespace":
		case "ResourceClaim":
			var c resourceapi.ResourceClaim
			mustUnmarshal(t, raw.Raw, &c)
			c.Namespace = ns
			_, err = kube.ResourceV1().ResourceClaims(ns).Create(ctx, &c, metav1.CreateOptions{})
		case "ResourceClaimTemplate":
			var c resourceapi.ResourceClaimTemplate
			mustUnmarshal(t, raw.Raw, &c)
			c.Namespace = ns
			_, err = kube.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, &c, metav1.CreateOptions{})
		case "Pod":
			// Created after every claim of the file: the webhook looks a pod's claims up.
			var p corev1.Pod
			mustUnmarshal(t, raw.Raw, &p)
			p.Namespace = ns
			pods = append(pods, p)
		default:
			t.Fatalf("%s: kind %s is not handled here", filepath.Base(file), meta.Kind)
		}
		if err != nil {
			t.Fatalf("%s: the API server refuses a %s: %v", filepath.Base(file), meta.Kind, err)
		}
	}
	var names []string
	for i := range pods {
		if _, err := kube.CoreV1().Pods(ns).Create(ctx, &pods[i], metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s: the API server refuses pod %s: %v", filepath.Base(file), pods[i].Name, err)
		}
		names = append(names, pods[i].Name)
	}
	if len(names) == 0 {
		t.Fatalf("%s has no Pod: an example shows what a pod gets", filepath.Base(file))
	}
	return names
}

// deleteExampleNamespace deletes the example's pods (at once) and claims, then its namespace,
// and waits until the node has no CDI spec or claim directory left: the next example has the
// whole node.
func deleteExampleNamespace(t *testing.T, ns string) {
	ctx := context.Background()
	zero := metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](0)}
	if err := kube.CoreV1().Pods(ns).DeleteCollection(ctx, zero, metav1.ListOptions{}); err != nil {
		t.Errorf("delete pods of %s: %v", ns, err)
	}
	eventually(t, defaultTimeout, "the pods of "+ns+" gone", func() (bool, error) {
		l, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0, err
	})
	if err := kube.ResourceV1().ResourceClaims(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Errorf("delete claims of %s: %v", ns, err)
	}
	if err := kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete namespace %s: %v", ns, err)
	}
	eventually(t, defaultTimeout, "every claim of "+ns+" unprepared", func() (bool, error) {
		specs, _ := filepathGlob("/var/run/cdi/" + driverName + "-claim_*.json")
		dirs, _ := filepathGlob("/var/lib/vgpu-dra/claims/*")
		return len(specs) == 0 && len(dirs) == 0, fmt.Errorf("specs %v, claim dirs %v", specs, dirs)
	})
}

// podLog is the container's log so far.
func podLog(t *testing.T, ns, pod, ctr string) string {
	t.Helper()
	return mustRun(t, "kubectl", "logs", "-n", ns, pod, "-c", ctr)
}

// expectLog waits until the container's log has a match of pattern (the example's command
// prints what it got before it sleeps).
// podClaimStatusData is the data of this driver's entry in the device status of the pod's
// (first) claim, once the plugin wrote it.
func podClaimStatusData(t *testing.T, ns, pod string) map[string]any {
	t.Helper()
	var data map[string]any
	eventually(t, defaultTimeout, pod+"'s claim's device status", func() (bool, error) {
		p, err := kube.CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{})
		if err != nil || len(p.Status.ResourceClaimStatuses) == 0 || p.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
			return false, fmt.Errorf("pod's claim statuses: %v", err)
		}
		c, err := kube.ResourceV1().ResourceClaims(ns).Get(context.Background(), *p.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, d := range c.Status.Devices {
			if d.Driver == driverName && d.Data != nil {
				data = map[string]any{}
				return json.Unmarshal(d.Data.Raw, &data) == nil, fmt.Errorf("data %s", d.Data.Raw)
			}
		}
		return false, fmt.Errorf("status.devices %+v", c.Status.Devices)
	})
	return data
}

func expectLog(t *testing.T, ns, pod, ctr, pattern string) {
	t.Helper()
	re := regexp.MustCompile(pattern)
	eventually(t, defaultTimeout, fmt.Sprintf("%s/%s's log to match %s", pod, ctr, pattern), func() (bool, error) {
		out, err := run(t, "kubectl", "logs", "-n", ns, pod, "-c", ctr)
		return err == nil && re.MatchString(out), fmt.Errorf("log %q (%v)", out, err)
	})
}
