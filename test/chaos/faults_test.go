//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vgpu-dra/vgpu-dra/test/cluster"
)

// fault is one kind of fault the suite injects while the churn runs.
type fault struct {
	name string
	// prefix names the fault's jobs (and through them its pods, claims and events).
	prefix     string
	iterations int
	// causes are what an error a user sees may say during this fault, besides commonCauses.
	causes []*regexp.Regexp
	// inject injects the fault once and returns when it has struck (not when the node has
	// recovered: the suite checks that). An error means the injection itself failed.
	inject func(fr *faultRun, i int) error
	// finish, when set, runs after the last injection, before the churn stops.
	finish func(fr *faultRun)
	// strayGrace, when set, lets a vGPU container that the runtime created without the
	// plugin's adjustment run that long: the plugin stops it once it is back. Only a plugin that
	// dies under a CreateContainer makes containerd 2.4.2 do that (contract §4, guard 4).
	strayGrace time.Duration
}

// faultRun is one fault's run: its record and the jobs it started beside the churn.
type faultRun struct {
	s    *suite
	r    *run
	jobs sync.WaitGroup
}

// goJob runs a job of the fault's own beside the churn; the fault waits for it before it ends.
func (fr *faultRun) goJob(f func()) { fr.jobs.Go(f) }

// commonCauses are errors users may see in every fault, each naming its cause.
var commonCauses = []*regexp.Regexp{
	// The kubelet has no plugin to ask: it is down or restarting (the kubelet's message).
	regexp.MustCompile(`DRA driver ` + regexp.QuoteMeta(cluster.DriverName) + ` is not registered`),
	// containerd's NRI validator refuses a vGPU container while the plugin's NRI side is not
	// connected (contract §1): the annotation's purpose.
	regexp.MustCompile(`required plugin "` + regexp.QuoteMeta(cluster.DriverName) + `" not present`),
	// The scheduler waits for a claim it is allocating (another pod of a shared claim).
	regexp.MustCompile(`^event FailedScheduling: .*resource claim \S+ is in the process of being allocated`),
}

// restartCauses are errors users see while the kubelet starts, in the kubelet and reboot faults.
var restartCauses = []*regexp.Regexp{
	// The kubelet's ConfigMap manager has not yet registered the pod's service-account volume
	// source right after its start (a kubelet message; the mount is retried).
	regexp.MustCompile(`^event FailedMount: MountVolume.SetUp failed for volume "kube-api-access-\S+" : object "\S+"/"kube-root-ca.crt" not registered`),
	// At start-up the kubelet deletes the ResourceSlices of drivers that have not registered
	// with it yet, so until the plugin has registered and published again the scheduler finds
	// no device for a new claim (the scheduler's wording).
	regexp.MustCompile(`^event FailedScheduling: 0/1 nodes are available: 1 cannot allocate all claims`),
	// A starting kubelet reports the node NotReady until its runtime checks pass, and the node
	// lifecycle controller taints it node.kubernetes.io/not-ready meanwhile (the scheduler's
	// wording; kubectl describe node names the taint).
	regexp.MustCompile(`^event FailedScheduling: 0/1 nodes are available: 1 node\(s\) had untolerated taint\(s\)`),
}

// faults are the suite's faults, in the order they run.
func (s *suite) faults() []fault {
	return []fault{
		s.containerdFault(),
		s.pluginKillFault(),
		s.kubeletFault(),
		s.rebootFault(),
		s.stateFSFault(),
		s.apiOutageFault(),
	}
}

// runFault runs one fault: the churn and the continuous checker start, the fault strikes
// iterations times at random moments, the node must serve again and settle after each; then the
// churn drains, the node must be clean, the errors users saw must name their causes and the
// plugin's figures must be back at the baseline.
func (s *suite) runFault(t *testing.T, f fault) {
	ctx := context.Background()
	r := &run{name: f.name, start: time.Now(), causes: append(append([]*regexp.Regexp{}, commonCauses...), f.causes...),
		injecting: true, strayGrace: f.strayGrace}
	defer func() { s.rows = append(s.rows, r.row()) }()
	before, err := s.waitPluginServing(ctx, 3*time.Minute)
	if err != nil {
		r.violate("the plugin does not serve before the fault", err.Error())
		t.Fatal(err)
	}
	chk := s.startChecker(r)
	ch := s.startChurn(r, f.prefix, s.form.workers)
	s.waitJobs(r, 1, runBound)
	fr := &faultRun{s: s, r: r}
	for i := range f.iterations {
		s.pause(ctx)
		if err := f.inject(fr, i); err != nil {
			r.violate(fmt.Sprintf("injection %d failed", i+1), err.Error())
			continue
		}
		r.mu.Lock()
		r.iterations++
		r.mu.Unlock()
		start := time.Now()
		if _, err := s.waitPluginServing(ctx, 3*time.Minute); err != nil {
			r.violate("the plugin does not serve again", fmt.Sprintf("after injection %d: %v", i+1, err))
		}
		r.sample("serving again", time.Since(start))
		s.settle(r, fmt.Sprintf("after injection %d", i+1), 90*time.Second)
	}
	r.injectionsDone()
	if f.finish != nil {
		f.finish(fr)
	}
	fr.jobs.Wait()
	ch.stop()
	s.drain(r)
	chk.stop()
	s.collectEvents(ctx, r, f.prefix)
	r.checkUserErrors()
	after, err := s.settledFigures(s.baseline)
	r.check(3)
	if err != nil {
		r.violate("the plugin's figures do not return to the baseline", err.Error())
	}
	r.note("plugin %s (restarts %d→%d)", after, before.restarts, after.restarts)
	for _, v := range r.violationList() {
		t.Errorf("%s", v)
	}
}

// collectEvents records the Warning events of the fault's pods as errors users saw.
func (s *suite) collectEvents(ctx context.Context, r *run, prefix string) {
	list, err := c.Kube.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: "type=Warning"})
	if err != nil {
		r.violate("events cannot be listed", err.Error())
		return
	}
	for _, e := range list.Items {
		if len(e.InvolvedObject.Name) > len(prefix) && e.InvolvedObject.Name[:len(prefix)+1] == prefix+"-" {
			for range max(e.Count, 1) {
				r.sawUserError("event "+e.Reason, e.Message)
			}
		}
	}
}

// finalChecks runs after every fault: the node holds nothing, and the plugin is at its baseline.
func (s *suite) finalChecks(t *testing.T) {
	r := &run{name: "end", start: time.Now()}
	defer func() { s.rows = append(s.rows, r.row()) }()
	s.drain(r)
	s.settle(r, "at the end", 90*time.Second)
	f, err := s.settledFigures(s.baseline)
	r.check(3)
	if err != nil {
		r.violate("the plugin's figures do not return to the baseline", err.Error())
	}
	r.note("plugin baseline %s", s.baseline)
	r.note("plugin at the end %s", f)
	for _, v := range r.violationList() {
		t.Errorf("%s", v)
	}
}

// printSummary prints the summary table and writes it to _output/chaos/summary.txt.
func (s *suite) printSummary(t *testing.T) {
	text := fmt.Sprintf("chaos suite (%s form), summary:\n%s", s.form.name, summaryText(s.rows))
	fmt.Print("\n" + text)
	dir := filepath.Join(c.RepoRoot, "_output", "chaos")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Errorf("write the summary: %v", err)
		return
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.txt"), []byte(text), 0o644); err != nil {
		t.Errorf("write the summary: %v", err)
	}
}

// containerdFault: containerd SIGKILLed and started again (hack/cluster-restart-containerd.sh).
// Running containers survive in their shims; the plugin's NRI connection drops and must come
// back, with Synchronize rebuilding its cache.
func (s *suite) containerdFault() fault {
	return fault{
		name: "containerd-sigkill", prefix: "ctrd", iterations: s.form.containerdKills,
		// A CRI call cut by containerd's death reaches users in the kubelet's wording, under
		// whatever reason or event the call's step gives it (CreateContainerError,
		// RunContainerError, CreateContainerConfigError, FailedCreatePodSandBox, Failed, ...):
		// which step is cut depends on the moment of the kill, and each run met another one.
		// So the suite matches the transport failure itself, anywhere in the message, not the
		// kubelet's framing: the cause users read is that the runtime's gRPC service went away.
		causes: []*regexp.Regexp{
			// The call could not reach containerd: its socket is named.
			regexp.MustCompile(`containerd\.sock`),
			// gRPC's status for a server that went away (connection refused or reset, preface
			// not read, transport closing).
			regexp.MustCompile(`rpc error: code = Unavailable`),
			// The bare transport error of a stream cut mid-call: the socket closed (EOF) or, when
			// the kill lands while the kubelet's request is still unread, reset by the kernel.
			regexp.MustCompile(`error reading from server: (EOF|(read unix \S+ )?connection reset by peer)`),
			// The kubelet's event for an image it could not inspect while containerd was down
			// carries only the reason; the container's waiting message beside it, checked too,
			// names containerd's socket.
			regexp.MustCompile(`^event Failed: Error: ImageInspectError$`),
		},
		inject: func(fr *faultRun, _ int) error {
			start := time.Now()
			if out, err := c.Script("hack/cluster-restart-containerd.sh"); err != nil {
				return fmt.Errorf("%w: %s", err, out)
			}
			fr.r.sample("containerd back", time.Since(start))
			return nil
		},
	}
}

// kubeletFault: the kubelet restarted, SIGTERM and SIGKILL in turn (hack/cluster-restart-kubelet.sh).
func (s *suite) kubeletFault() fault {
	return fault{
		name: "kubelet-restart", prefix: "kubelet", iterations: s.form.kubeletRestarts,
		causes: restartCauses,
		inject: func(fr *faultRun, i int) error {
			args := []string{}
			if i%2 == 1 {
				args = append(args, "--kill")
			}
			start := time.Now()
			if out, err := c.Script("hack/cluster-restart-kubelet.sh", args...); err != nil {
				return fmt.Errorf("%w: %s", err, out)
			}
			fr.r.sample("kubelet back", time.Since(start))
			return nil
		},
	}
}
