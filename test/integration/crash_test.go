package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/driver"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/plugin"
)

// TestCrashAtEachStep: the plugin, in a child process, is SIGKILLed at each step of Prepare and
// Unprepare (driver.Steps: between two changes to the disk, the last one in the background after
// the kubelet's answer; Prepare writes its record while it makes the files, so a kill at a file
// step finds the record durable or not). A plugin started on what the kill left must find the disk and the
// checkpoint consistent — every recorded claim complete with its CDI spec and its claim tmpfs,
// and no spec, directory, mount or temporary file of a claim it does not know — and the
// kubelet's retry must then succeed; a claim the kubelet was told is unprepared must go without
// one. A claim prepared before, on another GPU, is untouched throughout.
func TestCrashAtEachStep(t *testing.T) {
	for _, step := range driver.Steps {
		t.Run(string(step), func(t *testing.T) { crashAt(t, step, "gpu-0") })
	}
}

// TestCrashAtEachStepOfAPartition is TestCrashAtEachStep for a share of a MIG partition of a
// MIG-managed GPU (contract §18): besides the files and the record, the GPU's MIG instances
// must match the recorded partitions after every start-up (checkConsistent).
func TestCrashAtEachStepOfAPartition(t *testing.T) {
	for _, step := range driver.Steps {
		t.Run(string(step), func(t *testing.T) { crashAt(t, step, "gpu-0-mig-1g-18gb-0") })
	}
}

func crashAt(t *testing.T, step driver.Step, device string) {
	n := newNode(t, func(c *plugin.Config) {
		if strings.Contains(device, "-mig-") {
			c.MIGGPUs = "0"
		}
	})
	a := n.newClaim("a", allocated{request: "gpu", device: device, memory: "4Gi", cores: 30, shareID: shareA})
	bystander := n.newClaim("bystander", allocated{request: "gpu", device: "gpu-1", memory: "4Gi", cores: 30, shareID: shareB})
	unprepareStep := strings.HasPrefix(string(step), "unprepare")
	n.start()
	k := n.register()
	k.prepare(t, bystander)
	if unprepareStep {
		k.prepare(t, a)
	}
	n.stop()

	child := startCrashingPlugin(t, n, step, a, bystander)
	k = n.register()
	// The claim directory is removed in the background, after the kubelet has its answer.
	afterAnswer := step == driver.StepUnprepareClaimDir
	var err error
	if unprepareStep {
		_, err = k.tryUnprepare(a)
	} else {
		_, err = k.tryPrepare(a)
	}
	switch {
	case afterAnswer && err != nil && status.Code(err) != codes.Unavailable:
		t.Fatalf("Unprepare: %v", err)
	case afterAnswer && err != nil:
		// The background removal is kicked as Unprepare returns and may reach its step (and
		// the kill) before gRPC has written the answer: the kubelet then sees the connection
		// drop and would retry an Unprepare that is already done. What follows holds either way.
		t.Logf("the kill at %s came before the answer reached the kubelet: %v", step, err)
	case !afterAnswer && err == nil:
		t.Fatalf("the kubelet got an answer although the plugin was to be killed at %s", step)
	}
	if got := child.line(30 * time.Second); got != "crash at "+string(step) {
		t.Fatalf("child printed %q, want it killed at %s", got, step)
	}
	if err := child.cmd.Wait(); !killedBySIGKILL(err) {
		t.Fatalf("child ended with %v, want SIGKILL", err)
	}

	// The kubelet was told that Unprepare succeeded (or was about to be, at the last step before
	// the answer): it never asks again. A claim the checkpoint still lists (its removal was not
	// written yet) is unprepared by the start-up reconciliation once the API server no longer
	// has it; otherwise start-up removes what is left of it.
	answered := step == driver.StepUnprepareRemoved || afterAnswer
	if answered {
		if err := n.kube.ResourceV1().ResourceClaims(a.Namespace).Delete(t.Context(), a.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	n.start()
	if answered {
		deadline := time.Now().Add(20 * time.Second)
		for {
			if _, ok := n.readCheckpoint().Claims[string(a.UID)]; !ok && !exists(n.claimDir(string(a.UID))) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("start-up and the reconciliation left the claim the kubelet had unprepared")
			}
			time.Sleep(20 * time.Millisecond)
		}
	} else {
		recorded := unprepareStep || step == driver.StepPrepareRecorded
		// The record is written while the files are made: killed between, it may be durable
		// or not, and start-up must leave a consistent node either way (below).
		either := step == driver.StepPrepareClaimDir || step == driver.StepPrepareCDISpec
		_, ok := n.readCheckpoint().Claims[string(a.UID)]
		switch {
		case either:
			t.Logf("killed at %s, the record was durable: %v", step, ok)
		case ok != recorded:
			t.Errorf("after the kill at %s the checkpoint holds the claim: %v, want %v", step, ok, recorded)
		}
	}
	checkConsistent(t, n)

	k = n.register()
	switch {
	case answered:
	case unprepareStep:
		k.unprepare(t, a)
	default:
		if r := k.prepare(t, a)[string(a.UID)]; r.Error != "" {
			t.Fatalf("the kubelet's retry of Prepare: %s", r.Error)
		}
		if !exists(n.specPath(string(a.UID))) || n.readCheckpoint().Claims[string(a.UID)].State != checkpoint.PrepareCompleted {
			t.Fatal("the retried Prepare did not complete the claim")
		}
		k.unprepare(t, a)
	}
	checkConsistent(t, n)
	if exists(n.specPath(string(a.UID))) || exists(n.claimDir(string(a.UID))) {
		t.Error("the claim's spec or directory is left after its Unprepare")
	}
	if _, ok := n.readCheckpoint().Claims[string(bystander.UID)]; !ok || !exists(n.specPath(string(bystander.UID))) {
		t.Error("the claim prepared before the crash lost its record or its spec")
	}
	k.unprepare(t, bystander)
	if left := n.readCheckpoint().Claims; len(left) != 0 {
		t.Errorf("checkpoint holds %d claims after every Unprepare", len(left))
	}
	checkConsistent(t, n)
}

// checkConsistent checks what start-up must leave, whatever a crash left before it: the
// checkpoint holds completed claims only, each with its CDI spec and its claim directory on its
// own tmpfs; no CDI spec, claim directory or mount belongs to a claim the checkpoint does not
// know; no temporary file of a spec or of the checkpoint is left.
func checkConsistent(t *testing.T, n *node) {
	t.Helper()
	cp := n.readCheckpoint()
	mounts := mountsUnder(t, n.cfg.StateDir)
	for uid, c := range cp.Claims {
		if c.State != checkpoint.PrepareCompleted {
			t.Errorf("claim %s is recorded as %s", uid, c.State)
		}
		if !exists(n.specPath(uid)) {
			t.Errorf("recorded claim %s has no CDI spec", uid)
		}
		if !slices.Contains(mounts, n.claimDir(uid)) {
			t.Errorf("recorded claim %s has no tmpfs (mounts %v)", uid, mounts)
		}
	}
	for _, m := range mounts {
		if _, ok := cp.Claims[filepath.Base(m)]; !ok || filepath.Dir(m) != filepath.Join(n.cfg.StateDir, "claims") {
			t.Errorf("mount %s belongs to no recorded claim", m)
		}
	}
	for _, name := range dirNames(t, filepath.Join(n.cfg.StateDir, "claims")) {
		if _, ok := cp.Claims[name]; !ok {
			t.Errorf("claim directory %s belongs to no recorded claim", name)
		}
	}
	for _, name := range dirNames(t, n.cfg.CDIDir) {
		uid, isSpec := strings.CutPrefix(strings.TrimSuffix(name, ".json"), driverName+"-claim_")
		if _, ok := cp.Claims[uid]; strings.HasSuffix(name, ".tmp") || (isSpec && !ok) {
			t.Errorf("CDI dir holds %s, which belongs to no recorded claim", name)
		}
	}
	for _, name := range dirNames(t, filepath.Join(n.cfg.KubeletDir, "plugins", driverName)) {
		if strings.Contains(name, ".tmp-") {
			t.Errorf("a temporary file of the checkpoint is left: %s", name)
		}
	}
	checkMIGConsistent(t, n, cp)
}

// checkMIGConsistent: the simulated GPUs' MIG instances (their state file, the "hardware") are
// exactly the partitions the checkpoint records, each recorded with its instance's ID.
func checkMIGConsistent(t *testing.T, n *node, cp checkpoint.Data) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(n.cfg.StateDir, "simulated-mig.json"))
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		GPUs map[string]struct {
			Instances []struct {
				GPUInstanceID int `json:"gpuInstanceID"`
				Placement     struct {
					Start int `json:"start"`
				} `json:"placement"`
			} `json:"instances"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	have := map[string]int{} // "<gpu>/<slot>" -> GPU instance ID
	for uuid, g := range st.GPUs {
		for _, in := range g.Instances {
			have[fmt.Sprintf("%s/%d", uuid, in.Placement.Start)] = in.GPUInstanceID
		}
	}
	want := map[string]int{}
	for _, c := range cp.Claims {
		for _, dev := range c.Devices {
			if dev.IsMIG() {
				want[fmt.Sprintf("%s/%d", dev.GPUUUID, dev.MIG.Start)] = dev.MIG.GPUInstanceID
			}
		}
	}
	if !maps.Equal(have, want) {
		t.Errorf("MIG instances %v, recorded partitions %v: want the same", have, want)
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func killedBySIGKILL(err error) bool {
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return false
	}
	ws, ok := exit.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// startCrashingPlugin runs the plugin of n in a child process, with the claims in its own fake
// API server, that kills itself with SIGKILL at step (it prints "crash at <step>" first).
func startCrashingPlugin(t *testing.T, n *node, step driver.Step, claims ...*resourceapi.ResourceClaim) *child {
	t.Helper()
	cfg := n.cfg
	cfg.HealthAddress, cfg.MetricsAddress, cfg.DebugSocket = "", "", "-"
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	claimsJSON, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	c := startChild(t, "crashing-plugin", "VGPU_PLUGIN_CONFIG="+string(cfgJSON), "VGPU_PLUGIN_CLAIMS="+string(claimsJSON), "VGPU_CRASH_AT="+string(step))
	if got := c.line(30 * time.Second); got != "started" {
		t.Fatalf("crashing plugin: %q, want started", got)
	}
	return c
}

// crashingPluginChild is the child of startCrashingPlugin.
func crashingPluginChild() error {
	var cfg plugin.Config
	if err := json.Unmarshal([]byte(os.Getenv("VGPU_PLUGIN_CONFIG")), &cfg); err != nil {
		return err
	}
	var claims []*resourceapi.ResourceClaim
	if err := json.Unmarshal([]byte(os.Getenv("VGPU_PLUGIN_CLAIMS")), &claims); err != nil {
		return err
	}
	gpus, err := gpu.NewSimulated("dgx-h200", 2, nodeName)
	if err != nil {
		return err
	}
	kube := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: nodeUID}})
	for _, c := range claims {
		c.ResourceVersion = ""
		if _, err := kube.ResourceV1().ResourceClaims(c.Namespace).Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	crashAt := driver.Step(os.Getenv("VGPU_CRASH_AT"))
	p, err := plugin.Start(context.Background(), cfg, plugin.Deps{KubeClient: kube, GPUs: gpus, BootID: "boot-1",
		AtStep: func(s driver.Step) {
			if s == crashAt {
				fmt.Println("crash at " + string(s))
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the signal is on its way
			}
		}})
	if err != nil {
		return err
	}
	fmt.Println("started")
	<-p.Done()
	return nil
}
