//go:build chaos

package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vgpu-dra/vgpu-dra/test/cluster"
)

// taskDir holds containerd's bundle of every task of the CRI namespace: a pod's sandbox gets its
// bundle (config.json, annotated with the pod's UID) when containerd starts it.
var taskDir = filepath.Join(filepath.Dir(cluster.ContainerdSocket()), "state", "io.containerd.runtime.v2.task", "k8s.io")

// apiOutageFault: the API server unreachable for apiOutage (hack/chaos/apiserver.sh freezes it)
// while claims are prepared and while NRI must read a claim from it: the second pod of a shared
// claim is not in the reservedFor that the first pod's Prepare recorded, so NRI reads the claim
// when containerd creates that pod's container (contract §4). The outage starts the moment
// containerd starts that pod's sandbox: the kubelet has read the claim and asks for the
// container next. That container must fail, naming the API read, and run once the API server is
// back; pods whose Prepare the outage met must run too.
func (s *suite) apiOutageFault() fault {
	nriFailures := 0
	return fault{
		name: "api-unreachable", prefix: "api", iterations: s.form.apiOutages,
		causes: []*regexp.Regexp{
			// The kubelet's read of a claim before Prepare.
			regexp.MustCompile(`fetch ResourceClaim .*(deadline exceeded|timeout|connection refused|EOF|connection lost|unable to return a response)`),
			// NRI's read of a claim for a pod not in the recorded reservedFor.
			regexp.MustCompile(`read claim .* to check that pod .* is reserved for it: .*(deadline exceeded|timeout|connection refused|EOF|connection lost)`),
		},
		inject: func(fr *faultRun, _ int) error {
			n, err := s.apiOutage(fr)
			nriFailures += n
			return err
		},
		finish: func(fr *faultRun) {
			fr.r.check(1)
			if nriFailures == 0 {
				fr.r.violate("no outage met an NRI read", "vgpu_dra_nri_errors_total{hook=\"create_container\"} did not grow in any outage: the fault did not strike where it should")
			}
		},
	}
}

// apiOutage runs one outage and returns how many containers NRI failed during it.
func (s *suite) apiOutage(fr *faultRun) (int, error) {
	ctx := context.Background()
	shared := job{name: s.jobName("api"), shared: true}
	pods := shared.pods()
	if _, ok := s.createClaim(ctx, fr.r, shared); !ok {
		return 0, fmt.Errorf("claim %s not created", shared.name)
	}
	created := time.Now()
	if !s.createPod(ctx, fr.r, pods[0]) || !s.waitRunning(ctx, fr.r, pods[0].Name, created) {
		return 0, fmt.Errorf("the first pod of %s does not run", shared.name)
	}
	plugin, err := s.pluginPod(ctx)
	if err != nil {
		return 0, err
	}
	before, err := s.figuresOf(ctx, plugin)
	if err != nil {
		return 0, err
	}
	tw, err := watchDir(taskDir)
	if err != nil {
		return 0, err
	}
	defer tw.close()
	var second types.UID
	err = retry(ctx, apiBound, func(ctx context.Context) error {
		p, err := c.Kube.CoreV1().Pods(namespace).Create(ctx, pods[1], metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) { // an earlier attempt that timed out made it
			p, err = c.Kube.CoreV1().Pods(namespace).Get(ctx, pods[1].Name, metav1.GetOptions{})
		}
		if err == nil {
			second = p.UID
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("create pod %s: %w", pods[1].Name, err)
	}
	// Pods whose Prepare the outage meets, bound to the node just before it.
	targets := []job{{name: s.jobName("api")}, {name: s.jobName("api")}}
	targetsCreated := map[string]time.Time{}
	for _, j := range targets {
		if _, at, ok := s.createJob(ctx, fr.r, j); ok {
			targetsCreated[j.name] = at
		}
	}
	hit, err := tw.until(runBound, func(name string) bool { return sandboxPodUID(filepath.Join(taskDir, name)) == string(second) })
	if err != nil || !hit {
		return 0, fmt.Errorf("containerd never started the sandbox of %s: %v", pods[1].Name, err)
	}
	if out, err := c.Script("hack/chaos/apiserver.sh", "freeze"); err != nil {
		return 0, fmt.Errorf("%w: %s", err, out)
	}
	frozen := time.Now()
	thaw := func() error {
		if out, err := c.Script("hack/chaos/apiserver.sh", "thaw"); err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}
	defer func() { _ = thaw() }()
	time.Sleep(time.Until(frozen.Add(apiOutage))) // the outage itself
	if err := thaw(); err != nil {
		return 0, err
	}
	fr.r.sample("API server unreachable", time.Since(frozen))
	fr.goJob(func() {
		s.awaitJob(ctx, fr.r, shared, created)
		s.deleteJob(ctx, fr.r, shared)
	})
	for _, j := range targets {
		if at, ok := targetsCreated[j.name]; ok {
			fr.goJob(func() {
				s.awaitJob(ctx, fr.r, j, at)
				s.deleteJob(ctx, fr.r, j)
			})
		}
	}
	after, err := s.figuresOf(ctx, plugin)
	if err != nil {
		return 0, err
	}
	if after.restarts != before.restarts {
		return 0, fmt.Errorf("the plugin restarted during the outage (restarts %d → %d)", before.restarts, after.restarts)
	}
	failed := int(after.nriCreateErrors - before.nriCreateErrors)
	for range failed {
		fr.r.count("containers NRI failed for want of the API server")
	}
	return failed, nil
}

// sandboxPodUID is the pod UID a task bundle's config.json carries when the task is a pod's
// sandbox (containerd writes it as the task starts: waited for up to a second); empty otherwise.
func sandboxPodUID(bundle string) string {
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
		if err != nil {
			continue
		}
		if json.Unmarshal(b, &spec) != nil {
			continue // being written
		}
		if spec.Annotations["io.kubernetes.cri.container-type"] != "sandbox" {
			return ""
		}
		return spec.Annotations["io.kubernetes.cri.sandbox-uid"]
	}
	return ""
}
