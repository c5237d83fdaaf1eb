//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/test/cluster"
)

// fillDir is where hack/chaos/state-fs.sh puts what fills the state dir's file system.
var fillDir = filepath.Join(cluster.StateDir, ".chaos-fill")

// stateFSFault: the plugin's state dir's file system full (hack/chaos/state-fs.sh) while claims
// are prepared. The churn goes on, and every claim it unprepares gives an inode back, which the
// next Prepare would take: a keeper takes each one back at once, so the disk stays full. A Prepare
// must fail naming the full disk, leave nothing behind (no checkpoint entry, CDI spec or
// directory: the kubelet's retry starts from scratch), and succeed once the disk is freed.
// Running pods are not harmed: their directories are on their claims' tmpfs.
func (s *suite) stateFSFault() fault {
	return fault{
		name: "state-fs-full", prefix: "full", iterations: s.form.diskFulls,
		causes: []*regexp.Regexp{
			regexp.MustCompile(`create claim directory: .*no space left on device`),
		},
		inject: func(fr *faultRun, _ int) error {
			ctx := context.Background()
			if out, err := c.Script("hack/chaos/state-fs.sh", "fill"); err != nil {
				return fmt.Errorf("%w: %s", err, out)
			}
			full := time.Now()
			keeper := keepFull()
			defer keeper.stop()
			// Claims prepared while the disk is full.
			targets := []job{{name: s.jobName("full")}, {name: s.jobName("full")}}
			created := map[string]time.Time{}
			failed := 0
			for _, j := range targets {
				uid, at, ok := s.createJob(ctx, fr.r, j)
				if !ok {
					return fmt.Errorf("job %s not created", j.name)
				}
				created[j.name] = at
				if s.awaitENOSPC(ctx, fr.r, j.name, string(uid)) {
					failed++
				}
			}
			fr.r.check(1)
			if failed == 0 {
				fr.r.violate("the full state dir failed no Prepare", "no target's Prepare failed with ENOSPC: the fault did not strike")
			}
			keeper.stop()
			fr.r.sample("state dir full for", time.Since(full))
			if out, err := c.Script("hack/chaos/state-fs.sh", "free"); err != nil {
				return fmt.Errorf("%w: %s", err, out)
			}
			for _, j := range targets {
				fr.goJob(func() {
					s.awaitJob(ctx, fr.r, j, created[j.name])
					s.deleteJob(ctx, fr.r, j)
				})
			}
			return nil
		},
	}
}

// keeper takes back every inode the churn frees on the full state dir, until stopped.
type keeper struct {
	stopCh chan struct{}
	done   chan struct{}
	once   sync.Once
}

// keepFull creates empty files in fillDir every 20 ms until the file system says ENOSPC again.
func keepFull() *keeper {
	k := &keeper{stopCh: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(k.done)
		for n := 0; ; {
			for {
				f, err := os.OpenFile(filepath.Join(fillDir, "keep-"+strconv.Itoa(n)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
				if err != nil {
					break // ENOSPC: full again
				}
				_ = f.Close()
				n++
			}
			select {
			case <-k.stopCh:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return k
}

func (k *keeper) stop() {
	k.once.Do(func() { close(k.stopCh) })
	<-k.done
}

// awaitENOSPC waits until the pod's Prepare has failed on the full disk (the kubelet's event) and
// checks that it left nothing of the claim behind; false when the pod ran instead (its Prepare
// took an inode before the keeper did: counted, not a fault of the plugin) or the wait ran out.
func (s *suite) awaitENOSPC(ctx context.Context, r *run, pod, claimUID string) bool {
	var ran bool
	err := cluster.Poll(ctx, 2*time.Minute, func() (bool, error) {
		list, err := c.Kube.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false, err
		}
		for _, e := range list.Items {
			if e.Reason == "FailedPrepareDynamicResources" && strings.Contains(e.Message, "no space left on device") {
				return true, nil
			}
		}
		p, err := c.Kube.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
		ran = err == nil && p.Status.Phase == corev1.PodRunning
		return ran, err
	})
	r.check(1)
	switch {
	case ran:
		r.count("Prepares that found a freed inode")
		return false
	case err != nil:
		r.violate("a Prepare on the full state dir does not fail naming it: "+pod, fmt.Sprintf("%v; events: %s", err, s.eventsOf(ctx, pod)))
		return false
	}
	r.count("Prepares failed on the full disk")
	st, err := readNode()
	r.check(3)
	if err != nil {
		r.violate("the node cannot be read", err.Error())
		return true
	}
	if pc, ok := st.plugin.Claims[claimUID]; ok && pc.State == checkpoint.PrepareCompleted {
		r.violate("a Prepare that failed on the full disk left its claim completed: "+pod, claimUID)
	}
	if st.specs[claimUID] {
		r.violate("a Prepare that failed on the full disk left its CDI spec: "+pod, claimUID)
	}
	if _, ok := st.dirs[claimUID]; ok {
		r.violate("a Prepare that failed on the full disk left its claim directory: "+pod, claimUID)
	}
	return true
}
