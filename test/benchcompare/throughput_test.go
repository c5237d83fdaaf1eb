//go:build benchcompare

package benchcompare

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// Pod throughput of the control plane, not of a node: how fast the scheduler places pods that
// use a vGPU (a claim from a template, allocated by the scheduler's DRA plugin from consumable
// capacity) against plain pods, with the controller-manager's and the scheduler's client QPS at
// their defaults and raised. The nodes are Node objects with a ResourceSlice each, as our plugin
// publishes it, and no kubelet: a pod counts once it is bound.
const (
	throughputNodes = 25
	throughputPods  = 300
	gpusPerNode     = 8
)

// qpsSetting is the controller-manager's and the scheduler's client QPS and burst.
type qpsSetting struct {
	name                 string
	cmQPS, cmBurst       int
	schedQPS, schedBurst int
}

var qpsSettings = []qpsSetting{
	{"default", 20, 30, 50, 100}, // kube-controller-manager and kube-scheduler 1.37 defaults
	{"raised", 200, 400, 400, 800},
}

// BenchmarkPodThroughput reports pods bound per second, plain and vGPU, at each QPS setting.
func BenchmarkPodThroughput(b *testing.B) {
	binDir := os.Getenv("VGPU_BENCH_CLUSTER_BIN")
	if binDir == "" {
		b.Fatal("VGPU_BENCH_CLUSTER_BIN is not set: run this through make bench-throughput (hack/bench-compare.sh)")
	}
	dir, err := os.MkdirTemp("/var/tmp", "vgbt-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	api := startAPIServer(b, binDir, filepath.Join(dir, "api"))
	kube, err := kubernetes.NewForConfig(api.config)
	if err != nil {
		b.Fatal(err)
	}
	fakeNodes(b, kube)
	for _, q := range qpsSettings {
		cm := startProc(b, "kube-controller-manager", filepath.Join(binDir, "kube-controller-manager"), nil,
			"--kubeconfig", api.kubeconfig, "--controllers", "resourceclaim-controller", "--leader-elect=false",
			"--secure-port=0", "--kube-api-qps", fmt.Sprint(q.cmQPS), "--kube-api-burst", fmt.Sprint(q.cmBurst))
		sched := startProc(b, "kube-scheduler", filepath.Join(binDir, "kube-scheduler"), nil,
			"--kubeconfig", api.kubeconfig, "--leader-elect=false", "--secure-port=0",
			"--kube-api-qps", fmt.Sprint(q.schedQPS), "--kube-api-burst", fmt.Sprint(q.schedBurst))
		for _, vgpu := range []bool{false, true} {
			kind := "plain"
			if vgpu {
				kind = "vgpu"
			}
			rate := podsPerSecond(b, kube, fmt.Sprintf("%s-%s", q.name, kind), vgpu, cm, sched)
			b.Logf("QPS %s (controller-manager %d/%d, scheduler %d/%d): %s pods %.1f/s", q.name, q.cmQPS, q.cmBurst, q.schedQPS, q.schedBurst, kind, rate)
			b.ReportMetric(rate, fmt.Sprintf("%s-pods/s-qps-%s", kind, q.name))
		}
		cm.stop()
		sched.stop()
	}
}

// fakeNodes creates the nodes (Ready, room for the pods), a ResourceSlice of gpusPerNode shareable
// GPUs on each as our plugin publishes them, and the DeviceClass.
func fakeNodes(b *testing.B, kube kubernetes.Interface) {
	b.Helper()
	ctx := context.Background()
	capacity := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("1000"), corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("512Gi")}
	for i := range throughputNodes {
		name := fmt.Sprintf("sim-node-%02d", i)
		n, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		n.Status = corev1.NodeStatus{Capacity: capacity, Allocatable: capacity,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}}
		if _, err := kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
		slice := &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-vgpu"},
			Spec: resourceapi.ResourceSliceSpec{Driver: "vgpu.dra.dev", NodeName: ptr.To(name),
				Pool: resourceapi.ResourcePool{Name: name, ResourceSliceCount: 1}},
		}
		for g := range gpusPerNode {
			slice.Spec.Devices = append(slice.Spec.Devices, resourceapi.Device{
				Name: fmt.Sprintf("gpu-%d", g), AllowMultipleAllocations: ptr.To(true),
				Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
					"memory": {Value: resource.MustParse("140Gi")},
					"cores":  {Value: resource.MustParse("100")},
				},
			})
		}
		if _, err := kube.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "vgpu.dra.dev"},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "vgpu.dra.dev"`}}}}}
	if _, err := kube.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
}

// podsPerSecond creates throughputPods pods in a namespace of their own from 8 workers and
// returns how many were bound per second, from the first create to the last binding.
func podsPerSecond(b *testing.B, kube kubernetes.Interface, ns string, vgpu bool, procs ...*proc) float64 {
	b.Helper()
	ctx := context.Background()
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	// The API server's ServiceAccount admission refuses a pod whose service account does not
	// exist, and no controller-manager here runs the controller that makes "default".
	if _, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app"}},
		AutomountServiceAccountToken: ptr.To(false),
		// The fake nodes are not Ready for long (no kubelet renews them); nothing evicts here,
		// but the scheduler must not refuse them for a taint either.
		Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}}}
	if vgpu {
		tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "vgpu", Namespace: ns},
			Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
				Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
					DeviceClassName: "vgpu.dra.dev",
					Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
						"memory": resource.MustParse("1Gi"), "cores": resource.MustParse("1")}},
				}}}}}}}
		if _, err := kube.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("vgpu")}}
		pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	}
	next := make(chan int, throughputPods)
	for i := range throughputPods {
		next <- i
	}
	close(next)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, throughputPods)
	for range 8 {
		wg.Go(func() {
			for i := range next {
				p := pod.DeepCopy()
				p.Name, p.Namespace = fmt.Sprintf("p-%d", i), ns
				if _, err := kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			b.Fatal(err)
		}
		bound := 0
		for _, p := range pods.Items {
			if p.Spec.NodeName != "" {
				bound++
			}
		}
		if bound == throughputPods {
			return float64(throughputPods) / time.Since(start).Seconds()
		}
		for _, p := range procs {
			if p.exited() {
				b.Fatalf("%s exited:\n%s", p.name, p.tail())
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: %d of %d pods bound after 5 minutes", ns, bound, throughputPods)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
