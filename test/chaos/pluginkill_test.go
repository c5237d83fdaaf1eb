//go:build chaos

package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"regexp"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/test/cluster"
)

// The points of a Prepare at which the plugin is killed, in turn.
var killPoints = []string{
	// The claim has just been recorded in the checkpoint (PrepareStarted is durable before any
	// file of the claim exists): the kill lands between that write and the claim's files.
	"recorded",
	// The claim's CDI spec has just been renamed into place: its files exist, and the checkpoint
	// may or may not say PrepareCompleted yet.
	"cdi-spec",
	// A random moment up to 3 s after the pod was created: before the kubelet calls Prepare, in
	// it, or after it, while containerd creates the container (NRI) or the library registers.
	"random",
}

// strayGrace is how long a vGPU container created without the plugin's adjustment may run in the
// plugin-kill fault: the plugin's restart (about 2 s) and its Synchronize, with room for a loaded
// node.
const strayGrace = 30 * time.Second

// pluginKillFault: the plugin SIGKILLed at a point of a Prepare (a real kill of the process, as
// the OOM killer would: no drain, no goodbye), the kubelet restarting its container. Each kill
// strikes a new claim's Prepare; the churn's Prepares in flight are struck too. What the
// checkpoint held for the claim when the process died is counted.
func (s *suite) pluginKillFault() fault {
	return fault{
		name: "plugin-sigkill", prefix: "kill", iterations: s.form.pluginKills,
		causes: []*regexp.Regexp{
			// The kubelet's call broke with the process.
			regexp.MustCompile(`NodePrepareResources: rpc error: code = Unavailable`),
			regexp.MustCompile(`NodeUnprepareResources: rpc error: code = Unavailable`),
			// The library in a container created without the plugin (killed under its
			// CreateContainer), until the plugin, back, stops it.
			regexp.MustCompile(`^library: libvgpu: .*` + regexp.QuoteMeta(strayRefusal)),
		},
		strayGrace: strayGrace,
		inject:     s.killInPrepare,
	}
}

// killInPrepare starts a job and SIGKILLs the plugin at killPoints[i mod 3] of its claim's
// Prepare, then waits until the kubelet has started a new plugin process.
func (s *suite) killInPrepare(fr *faultRun, i int) error {
	ctx := context.Background()
	pid, err := s.pluginPID()
	if err != nil {
		return err
	}
	started, err := processStart(pid)
	if err != nil {
		return err
	}
	// Watch before the claim exists: its first write must not be missed.
	ckw, err := watchDir(filepath.Dir(cluster.PluginCheckpoint))
	if err != nil {
		return err
	}
	defer ckw.close()
	cdiw, err := watchDir(filepath.Dir(cdiSpecGlob))
	if err != nil {
		return err
	}
	defer cdiw.close()

	j := job{name: s.jobName("kill")}
	uid, created, ok := s.createJob(ctx, fr.r, j)
	if !ok {
		return fmt.Errorf("job %s not created", j.name)
	}
	fr.goJob(func() {
		s.awaitJob(ctx, fr.r, j, created)
		s.deleteJob(ctx, fr.r, j)
	})
	point := killPoints[i%len(killPoints)]
	hit := true
	switch point {
	case "recorded":
		hit, err = ckw.until(runBound, func(name string) bool {
			if name != filepath.Base(cluster.PluginCheckpoint) {
				return false
			}
			d, err := checkpoint.ReadFile(cluster.PluginCheckpoint)
			_, ok := d.Claims[string(uid)]
			return err == nil && ok
		})
	case "cdi-spec":
		hit, err = cdiw.until(runBound, func(name string) bool { return name == cluster.DriverName+"-claim_"+string(uid)+".json" })
	default:
		time.Sleep(time.Until(created.Add(time.Duration(rand.Int64N(int64(3 * time.Second))))))
	}
	if err != nil {
		return err
	}
	if !hit {
		fr.r.count("kills whose point never came")
	}
	if now, err := processStart(pid); err != nil || now != started {
		return fmt.Errorf("the plugin (pid %d) went away before the kill: %v", pid, err)
	}
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		return fmt.Errorf("SIGKILL the plugin (pid %d): %w", pid, err)
	}
	killed := time.Now()
	state := "not recorded"
	if d, err := checkpoint.ReadFile(cluster.PluginCheckpoint); err == nil {
		if pc, ok := d.Claims[string(uid)]; ok {
			state = string(pc.State)
		}
	}
	fr.r.count(fmt.Sprintf("killed at %s, claim %s", point, state))
	err = cluster.Poll(ctx, 2*time.Minute, func() (bool, error) {
		now, err := s.pluginPID()
		if err != nil {
			return false, err
		}
		return now != pid, errors.New("the killed plugin is still the one found")
	})
	if err != nil {
		return fmt.Errorf("no new plugin process after the kill: %w", err)
	}
	fr.r.sample("new plugin process", time.Since(killed))
	return nil
}
