//go:build chaos

package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vgpu-dra/vgpu-dra/test/cluster"
)

// namespace holds every pod and claim of the suite.
const namespace = "vgpu-chaos"

// suite is one run of the chaos suite on one install of the chart.
type suite struct {
	form form
	rt   *cluster.Runtime
	// gpuMemory is the published memory of the one simulated GPU (bytes): what the claims of
	// the plugin's checkpoint may take together.
	gpuMemory int64
	baseline  figures
	rows      []row
	seq       atomic.Int64 // names of jobs
}

func newSuite(t *testing.T, f form) *suite {
	s := &suite{form: f, rt: c.Runtime()}
	c.InstallChart(t)
	ctx := context.Background()
	if _, err := c.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", namespace, err)
	}
	cluster.Eventually(t, 2*time.Minute, "the namespace's default service account", func() (bool, error) {
		_, err := c.Kube.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	})
	cluster.Eventually(t, 2*time.Minute, "the node's ResourceSlice", func() (bool, error) {
		list, err := c.Kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + cluster.DriverName})
		if err != nil || len(list.Items) != 1 || len(list.Items[0].Spec.Devices) != 1 {
			return false, fmt.Errorf("slices: %v", err)
		}
		m := list.Items[0].Spec.Devices[0].Capacity["memory"]
		s.gpuMemory = m.Value.Value()
		return true, nil
	})
	// Warm up (the plugin's caches, the kubelet's, the image in the page cache), then take the
	// plugin's figures with nothing prepared: the baseline every fault must return to.
	warm := &run{name: "warm-up", start: time.Now()}
	ch := s.startChurn(warm, "warm", s.form.workers)
	s.waitJobs(warm, s.form.workers, 5*time.Minute)
	ch.stop()
	s.drain(warm)
	for _, v := range warm.violationList() {
		t.Errorf("warm-up: %s", v)
	}
	if t.Failed() {
		t.FailNow()
	}
	var err error
	if s.baseline, err = s.baselineFigures(); err != nil {
		t.Fatalf("baseline figures of the plugin: %v", err)
	}
	t.Logf("baseline of the plugin with nothing prepared: %s", s.baseline)
	return s
}

// jobName is a new name for a job's claim and pods: prefix, then a number unique in the run.
func (s *suite) jobName(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, s.seq.Add(1))
}

// pause sleeps a random time up to the form's maxPause: faults strike at random moments of the
// churn.
func (s *suite) pause(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(time.Duration(rand.Int64N(int64(s.form.maxPause)))):
	}
}

// pluginPod is the plugin's pod (exactly one on the node; the webhook's pods share the
// namespace).
func (s *suite) pluginPod(ctx context.Context) (*corev1.Pod, error) {
	list, err := c.Kube.CoreV1().Pods(cluster.PluginNS).List(ctx, metav1.ListOptions{LabelSelector: cluster.PluginSelector})
	if err != nil {
		return nil, fmt.Errorf("list the plugin's pods: %w", err)
	}
	var live []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	if len(live) != 1 {
		return nil, fmt.Errorf("%d plugin pods", len(live))
	}
	return &live[0], nil
}

// pluginPID is the running plugin's host PID, as hack/chaos/plugin.sh finds it.
func (s *suite) pluginPID() (int, error) {
	out, err := c.Script("hack/chaos/plugin.sh", "pid")
	if err != nil {
		return 0, fmt.Errorf("%w: %s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	pid, err := strconv.Atoi(lines[len(lines)-1])
	if err != nil {
		return 0, fmt.Errorf("hack/chaos/plugin.sh pid printed %q", out)
	}
	return pid, nil
}

// waitPluginServing waits until the plugin's pod is Ready and its NRI plugin connected and
// synchronized (vgpu_dra_nri_connected 1), and returns its figures.
func (s *suite) waitPluginServing(ctx context.Context, timeout time.Duration) (figures, error) {
	var fig figures
	err := cluster.Poll(ctx, timeout, func() (bool, error) {
		p, err := s.pluginPod(ctx)
		if err != nil {
			return false, err
		}
		if !podReady(p) {
			return false, fmt.Errorf("plugin pod %s not Ready", p.Name)
		}
		fig, err = s.figuresOf(ctx, p)
		if err != nil {
			return false, err
		}
		return fig.nriConnected, errors.New("NRI not connected")
	})
	if err != nil {
		return fig, fmt.Errorf("the plugin serving: %w", err)
	}
	return fig, nil
}

func podReady(p *corev1.Pod) bool { return cluster.PodReady(p) }

// retry calls f until it succeeds, fails with an error retrying cannot cure, or timeout passes:
// during a fault the API server or the kubelet may not answer for a while.
func retry(ctx context.Context, timeout time.Duration, f func(ctx context.Context) error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f(ctx)
		switch {
		case err == nil:
			return nil
		case apierrors.IsInvalid(err), apierrors.IsForbidden(err), apierrors.IsBadRequest(err):
			return err
		case time.Now().After(deadline):
			return fmt.Errorf("for %v: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}
