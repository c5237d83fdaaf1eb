//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"regexp"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vgpu-dra/vgpu-dra/test/cluster"
)

// rebootFault: a node "reboot" (hack/chaos/reboot-node.sh) with vGPU pods running on it. Every
// container dies, what lives in memory goes (CDI specs, the claims' tmpfs, the NRI socket,
// containerd's state), the pods stay bound to the node: the kubelet must bring the plugin back,
// which must restore the claims it had prepared, and each pod must run again in a new container
// that NRI gives its directories, with the library registering in it.
func (s *suite) rebootFault() fault {
	return fault{
		name: "node-reboot", prefix: "reboot", iterations: s.form.reboots,
		causes: append([]*regexp.Regexp{
			// The kubelet's CRI calls while containerd is down name its socket.
			regexp.MustCompile(`containerd\.sock`),
		}, restartCauses...),
		inject: func(fr *faultRun, i int) error {
			ctx := context.Background()
			// Pods that run when the node goes down: one with a claim of its own, two sharing one.
			stayers := []job{{name: s.jobName("reboot")}, {name: s.jobName("reboot"), shared: true}}
			before := map[string]string{} // pod → its container's ID
			for _, j := range stayers {
				_, created, ok := s.createJob(ctx, fr.r, j)
				if !ok || !s.awaitJob(ctx, fr.r, j, created) {
					return fmt.Errorf("the pods of %s do not run before the reboot", j.name)
				}
				for _, name := range j.podNames() {
					id, err := containerID(ctx, name)
					if err != nil {
						return err
					}
					before[name] = id
				}
			}
			start := time.Now()
			if out, err := c.Script("hack/chaos/reboot-node.sh"); err != nil {
				return fmt.Errorf("%w: %s", err, out)
			}
			fr.r.sample("node down and up", time.Since(start))
			fr.goJob(func() {
				for _, j := range stayers {
					for _, name := range j.podNames() {
						s.awaitNewContainer(ctx, fr.r, name, before[name], start)
					}
					s.deleteJob(ctx, fr.r, j)
				}
			})
			return nil
		},
	}
}

// containerID is the ID of the pod's one container, as the kubelet reports it.
func containerID(ctx context.Context, pod string) (string, error) {
	p, err := c.Kube.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("read pod %s: %w", pod, err)
	}
	if len(p.Status.ContainerStatuses) != 1 {
		return "", fmt.Errorf("pod %s reports %d containers", pod, len(p.Status.ContainerStatuses))
	}
	return p.Status.ContainerStatuses[0].ContainerID, nil
}

// awaitNewContainer waits until the pod runs a container other than old (the one the reboot
// killed), then has the library register and allocate in it.
func (s *suite) awaitNewContainer(ctx context.Context, r *run, pod, old string, since time.Time) {
	var last *corev1.Pod
	err := cluster.Poll(ctx, runBound, func() (bool, error) {
		p, err := c.Kube.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = p
		st := p.Status.ContainerStatuses
		return len(st) == 1 && st[0].ContainerID != old && st[0].State.Running != nil, nil
	})
	if err != nil {
		r.violate("a pod does not come back after the reboot: "+pod, fmt.Sprintf("%v; status: %s; events: %s", err, podStatus(last), s.eventsOf(ctx, pod)))
		return
	}
	r.sample("pods back after the reboot", time.Since(since))
	s.probe(ctx, r, pod, time.Now())
}
