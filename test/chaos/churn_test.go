//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vgpu-dra/vgpu-dra/test/cluster"
)

// Bounds of one job: a pod that should run must run within runBound of its creation or of the
// fault's last injection, whichever is later (run.deadline), and the API calls of a job are
// retried for apiBound. The kubelet retries a pod whose Prepare failed only at its next resync,
// a minute or more later; while the plugin is killed every few seconds a pod can miss several
// retries in a row, so the bound counts from the end of the injections.
const (
	runBound = 4 * time.Minute
	apiBound = 2 * time.Minute
)

// job is one unit of churn: a claim and the pods that use it.
type job struct {
	name string
	// shared: two pods share the claim, each with a request of its own (both on the one GPU).
	// The second pod is not in the reservedFor that Prepare recorded for the first, so NRI
	// reads the claim from the API server for it (contract §4).
	shared bool
}

// claim is the job's ResourceClaim: 1Gi and 5% of the GPU per request.
func (j job) claim() *resourceapi.ResourceClaim {
	cl := cluster.ClaimFor(namespace, j.name, "1Gi", 5)
	if j.shared {
		cl.Spec.Devices.Requests = []resourceapi.DeviceRequest{
			cluster.ShareRequest("a", "1Gi", 5), cluster.ShareRequest("b", "1Gi", 5),
		}
	}
	return cl
}

// pods are the job's pods; RestartPolicy Always, as a Deployment's: after a node reboot the
// kubelet starts their containers again.
func (j job) pods() []*corev1.Pod {
	mk := func(name, request string) *corev1.Pod {
		p := cluster.VGPUPod(namespace, name, j.name)
		p.Spec.RestartPolicy = corev1.RestartPolicyAlways
		// The local cluster runs no DNS: the node's resolv.conf, without the kubelet's warning
		// on every pod.
		p.Spec.DNSPolicy = corev1.DNSDefault
		p.Spec.Containers[0].Resources.Claims[0].Request = request
		return p
	}
	if j.shared {
		return []*corev1.Pod{mk(j.name+"-a", "a"), mk(j.name+"-b", "b")}
	}
	return []*corev1.Pod{mk(j.name, "")}
}

func (j job) podNames() []string {
	var names []string
	for _, p := range j.pods() {
		names = append(names, p.Name)
	}
	return names
}

// churn runs jobs in loops until it is stopped.
type churn struct {
	stopCh chan struct{}
	wg     sync.WaitGroup
}

// startChurn starts workers loops of jobs named prefix-N; every third job of a loop is shared.
func (s *suite) startChurn(r *run, prefix string, workers int) *churn {
	ch := &churn{stopCh: make(chan struct{})}
	for range workers {
		ch.wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-ch.stopCh:
					return
				default:
				}
				s.runJob(r, job{name: s.jobName(prefix), shared: i%3 == 2})
			}
		})
	}
	return ch
}

// stop lets every loop finish the job it is in, and waits for them.
func (ch *churn) stop() {
	close(ch.stopCh)
	ch.wg.Wait()
}

// waitJobs waits until the run has completed n jobs.
func (s *suite) waitJobs(r *run, n int, timeout time.Duration) {
	err := cluster.Poll(context.Background(), timeout, func() (bool, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.jobs >= n, fmt.Errorf("%d jobs so far", r.jobs)
	})
	if err != nil {
		r.violate("the churn is stuck", fmt.Sprintf("waiting for %d jobs: %v", n, err))
	}
}

// runJob creates the job, waits until its pods run and the library works in each, and deletes
// it. Whatever goes wrong is recorded in r as a violation with its evidence.
func (s *suite) runJob(r *run, j job) {
	ctx := context.Background()
	_, created, ok := s.createJob(ctx, r, j)
	if ok {
		s.awaitJob(ctx, r, j, created)
	}
	s.deleteJob(ctx, r, j)
}

// createJob creates the job's claim and pods and returns the claim's UID and when the pods were
// created; ok is false when the API server did not take them within apiBound.
func (s *suite) createJob(ctx context.Context, r *run, j job) (uid types.UID, created time.Time, ok bool) {
	if uid, ok = s.createClaim(ctx, r, j); !ok {
		return "", time.Time{}, false
	}
	created = time.Now()
	for _, p := range j.pods() {
		if !s.createPod(ctx, r, p) {
			return uid, created, false
		}
	}
	return uid, created, true
}

// createClaim creates the job's claim and returns its UID.
func (s *suite) createClaim(ctx context.Context, r *run, j job) (types.UID, bool) {
	var uid types.UID
	err := retry(ctx, apiBound, func(ctx context.Context) error {
		cl, err := c.Kube.ResourceV1().ResourceClaims(namespace).Create(ctx, j.claim(), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) { // an earlier attempt that timed out made it
			cl, err = c.Kube.ResourceV1().ResourceClaims(namespace).Get(ctx, j.name, metav1.GetOptions{})
		}
		if err == nil {
			uid = cl.UID
		}
		return err
	})
	if err != nil {
		r.violate("claim not created: "+j.name, err.Error())
		return "", false
	}
	return uid, true
}

// createPod creates one pod.
func (s *suite) createPod(ctx context.Context, r *run, p *corev1.Pod) bool {
	err := retry(ctx, apiBound, func(ctx context.Context) error {
		_, err := c.Kube.CoreV1().Pods(namespace).Create(ctx, p, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
	if err != nil {
		r.violate("pod not created: "+p.Name, err.Error())
		return false
	}
	return true
}

// awaitJob waits until each of the job's pods runs (by r.deadline(created)), then has the
// library register and allocate in it.
func (s *suite) awaitJob(ctx context.Context, r *run, j job, created time.Time) bool {
	ok := true
	for _, name := range j.podNames() {
		if !s.waitRunning(ctx, r, name, created) || !s.probe(ctx, r, name, created) {
			ok = false
		}
	}
	r.mu.Lock()
	r.jobs++
	r.pods += len(j.podNames())
	r.mu.Unlock()
	return ok
}

// waitRunning waits until the pod's container runs, recording every waiting message it shows on
// the way (what a user sees in kubectl describe).
func (s *suite) waitRunning(ctx context.Context, r *run, name string, created time.Time) bool {
	var last *corev1.Pod
	for time.Now().Before(r.deadline(created)) {
		p, err := c.Kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			last = p
			for _, st := range p.Status.ContainerStatuses {
				// A waiting state with neither reason nor message (the kubelet's status right after
				// a node reboot) shows a user nothing.
				if w := st.State.Waiting; w != nil && w.Reason != "ContainerCreating" && w.Reason != "PodInitializing" && (w.Reason != "" || w.Message != "") {
					r.sawUserError("container "+w.Reason, w.Message)
				}
			}
			if p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil {
				r.sample("to Running", time.Since(created))
				return true
			}
		}
		time.Sleep(cluster.PollInterval)
	}
	r.violate("pod never ran: "+name, fmt.Sprintf("not Running %v after its creation or the last injection; status: %s; events: %s",
		runBound, podStatus(last), s.eventsOf(ctx, name)))
	return false
}

// probe runs vgpu_probe in the pod: with libvgpu.so preloaded it registers with the plugin,
// reads its limits and allocates 256 MiB (granted: 0) and 1024 MiB more (past the 1Gi claim:
// CUDA_ERROR_OUT_OF_MEMORY, 2). kubectl exec is retried while the fault keeps the API server or
// the kubelet from answering. An answer of the library itself is final, but for one: in a fault
// that lets the runtime create a container without the plugin's adjustment (run.strayGrace), the
// library refuses CUDA there, naming why, until the plugin, back, stops the container; the probe
// then runs again in the container the kubelet creates instead.
func (s *suite) probe(ctx context.Context, r *run, pod string, created time.Time) bool {
	var out string
	var err error
	for time.Now().Before(r.deadline(created).Add(time.Minute)) {
		id, _ := containerID(ctx, pod)
		out, err = c.Run("kubectl", "exec", "-n", namespace, pod, "-c", "app", "--", "sh", "-c",
			`FAKE_GPU_DEVICES="$MANAGER_VISIBLE_DEVICE_0:144384" vgpu_probe alloc 256 1024 2>&1`)
		switch {
		case strings.Contains(out, "alloc 256 MiB = 0") && strings.Contains(out, "alloc 1024 MiB = 2"):
			return true
		case r.toleratesStrays() && strings.Contains(out, strayRefusal):
			r.sawUserError("library", firstLine(out))
			r.count("probes refused in a container created without NRI")
			s.awaitReplacement(ctx, r, pod, id)
			continue
		case strings.Contains(out, "pid ") || strings.Contains(out, "cuInit=") || strings.Contains(out, "libvgpu"):
			r.violate("the library failed in "+pod, fmt.Sprintf("vgpu_probe alloc 256 1024: %v: %s", err, out))
			return false
		}
		r.count("exec retried")
		time.Sleep(time.Second)
	}
	r.violate("the library never ran in "+pod, fmt.Sprintf("kubectl exec: %v: %s", err, out))
	return false
}

// strayRefusal is what libvgpu.so says when its container was created without the plugin's
// adjustment (library/src: the config directory is missing).
const strayRefusal = "the container was created without its vGPU configuration"

// awaitReplacement waits (within runBound) until the pod runs another container than old.
func (s *suite) awaitReplacement(ctx context.Context, r *run, pod, old string) {
	err := cluster.Poll(ctx, runBound, func() (bool, error) {
		p, err := c.Kube.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		st := p.Status.ContainerStatuses
		return len(st) == 1 && st[0].ContainerID != old && st[0].State.Running != nil, nil
	})
	if err != nil {
		r.violate("a container created without NRI is not replaced: "+pod, err.Error())
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}

// deleteJob deletes the job's pods (gracefully: the kubelet stops the containers first), waits
// until they are gone, and deletes the claim; the claim's unprepare is checked when the churn
// drains.
func (s *suite) deleteJob(ctx context.Context, r *run, j job) {
	for _, name := range j.podNames() {
		err := retry(ctx, apiBound, func(ctx context.Context) error {
			err := c.Kube.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		})
		if err != nil {
			r.violate("pod not deleted: "+name, err.Error())
		}
	}
	for _, name := range j.podNames() {
		err := cluster.Poll(ctx, runBound, func() (bool, error) {
			_, err := c.Kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), err
		})
		if err != nil {
			r.violate("pod not gone: "+name, fmt.Sprintf("%v; events: %s", err, s.eventsOf(ctx, name)))
		}
	}
	err := retry(ctx, apiBound, func(ctx context.Context) error {
		err := c.Kube.ResourceV1().ResourceClaims(namespace).Delete(ctx, j.name, metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
	if err != nil {
		r.violate("claim not deleted: "+j.name, err.Error())
	}
}

// podStatus is a short account of a pod's status for evidence.
func podStatus(p *corev1.Pod) string {
	if p == nil {
		return "never read"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "phase %s", p.Status.Phase)
	for _, cond := range p.Status.Conditions {
		if cond.Status != corev1.ConditionTrue {
			fmt.Fprintf(&b, ", %s=%s %s %s", cond.Type, cond.Status, cond.Reason, cond.Message)
		}
	}
	for _, st := range p.Status.ContainerStatuses {
		fmt.Fprintf(&b, ", container %s restarts %d state %+v", st.Name, st.RestartCount, st.State)
	}
	return b.String()
}

// eventsOf lists the events of one object of the namespace, oldest first, for evidence.
func (s *suite) eventsOf(ctx context.Context, name string) string {
	list, err := c.Kube.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return "events: " + err.Error()
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, fmt.Sprintf("%s %s (x%d): %s", e.Type, e.Reason, max(e.Count, 1), e.Message))
	}
	return "[" + strings.Join(out, "; ") + "]"
}
