package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
	"github.com/vgpu-dra/vgpu-dra/pkg/handover"
	"github.com/vgpu-dra/vgpu-dra/pkg/instancelock"
	"github.com/vgpu-dra/vgpu-dra/pkg/plugin"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
)

// instanceProc is one plugin instance in a child process (pluginChild), which a test can kill.
type instanceProc struct {
	*child
	pod   string
	lines chan string
	exit  chan struct{}
}

func startInstanceProc(t *testing.T, cfg plugin.Config, claims map[string]checkpoint.Claim, pod, crashAt string) *instanceProc {
	t.Helper()
	cfg.PodUID, cfg.HealthAddress, cfg.MetricsAddress, cfg.DebugSocket = pod, "", "", "-"
	b, _ := json.Marshal(cfg)
	api, _ := json.Marshal(apiClaims(claims))
	c := startChild(t, "plugin", "VGPU_PLUGIN_CONFIG="+string(b), "VGPU_PLUGIN_CRASH_AT="+crashAt, "VGPU_PLUGIN_CLAIMS="+string(api))
	p := &instanceProc{child: c, pod: pod, lines: make(chan string, 256), exit: make(chan struct{})}
	go func() {
		defer close(p.exit)
		for {
			s, err := c.out.ReadString('\n')
			if s = strings.TrimSpace(s); s != "" {
				p.lines <- s
			}
			if err != nil {
				return
			}
		}
	}()
	return p
}

// waitLine waits for the line want, failing the test if the process exits first.
func (p *instanceProc) waitLine(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		select {
		case s := <-p.lines:
			if s == want {
				return
			}
		case <-p.exit:
			t.Fatalf("instance %s exited before printing %q", p.pod, want)
		case <-deadline:
			t.Fatalf("instance %s did not print %q", p.pod, want)
		}
	}
}

// exited reports whether the process has ended (its output closed).
func (p *instanceProc) exited() bool {
	select {
	case <-p.exit:
		return true
	default:
		return false
	}
}

// crashClaims puts two completed NRI-path claims into the node's checkpoint, as an earlier
// plugin left them: what every crash must leave exactly as it is.
func crashClaims(t *testing.T, cfg plugin.Config) map[string]checkpoint.Claim {
	t.Helper()
	gpus, err := gpu.NewSimulated("dgx-h200", 2, nodeName)
	if err != nil {
		t.Fatal(err)
	}
	devs, err := gpus.Devices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	claims := map[string]checkpoint.Claim{}
	for i, pod := range []string{"90d00000-0000-4000-8000-0000000000c1", "90d00000-0000-4000-8000-0000000000c2"} {
		uid := fmt.Sprintf("0c1a1100-0000-4000-8000-0000000000c%d", i+1)
		claims[uid] = checkpoint.Claim{
			Namespace: "default", Name: fmt.Sprintf("crash-%d", i+1), State: checkpoint.PrepareCompleted, Path: contract.PathNRI,
			ReservedFor: []string{pod},
			Devices: []checkpoint.Device{{
				Request: "gpu", Pool: nodeName, Device: "gpu-0", GPUUUID: devs[0].UUID, Index: devs[0].Index,
				MemoryBytes: 1 << 30, Cores: 10,
				CDIDeviceIDs: []string{driverName + "/claim=" + uid + "-gpu-gpu-0", driverName + "/claim=" + uid + "-common"},
			}},
		}
	}
	if err := os.MkdirAll(cfg.PluginDataDir(), 0o750); err != nil {
		t.Fatal(err)
	}
	store, err := checkpoint.Open(cfg.CheckpointPath())
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Update(func(d *checkpoint.Data) error {
		d.BootID = "boot-1"
		maps.Copy(d.Claims, claims)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return claims
}

// apiClaims are the ResourceClaims the API server holds for prepared claims: allocated as
// prepared and reserved for their pod.
func apiClaims(claims map[string]checkpoint.Claim) []resourceapi.ResourceClaim {
	var out []resourceapi.ResourceClaim
	for uid, c := range claims {
		rc := resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name, UID: types.UID(uid)},
			Status: resourceapi.ResourceClaimStatus{
				Allocation:  &resourceapi.AllocationResult{},
				ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod", UID: types.UID(c.ReservedFor[0])}},
			},
		}
		for _, d := range c.Devices {
			rc.Status.Allocation.Devices.Results = append(rc.Status.Allocation.Devices.Results,
				resourceapi.DeviceRequestAllocationResult{Request: d.Request, Driver: driverName, Pool: d.Pool, Device: d.Device})
		}
		out = append(out, rc)
	}
	return out
}

// crashContainer is a container of one of crashClaims' claims as the runtime hands it over.
func crashContainer(id string, uid string, c checkpoint.Claim) (*api.PodSandbox, *api.Container) {
	pod := &api.PodSandbox{Id: "sb-" + id, Uid: c.ReservedFor[0], Namespace: c.Namespace, Name: "pod-" + id}
	ctr := &api.Container{Id: id, Name: "app", Env: []string{
		contract.EnvClaimUID + "=" + uid, contract.EnvVisibleDevicePfx + "0=" + c.Devices[0].GPUUUID,
	}}
	for _, d := range c.Devices[0].CDIDeviceIDs {
		ctr.CDIDevices = append(ctr.CDIDevices, &api.CDIDevice{Name: d})
	}
	return pod, ctr
}

// TestHandoverCrashPoints kills the outgoing or the incoming instance (SIGKILL, in a child
// process: the kernel frees its lock and closes its connections as after a crash) at each step
// of a handover, and checks what must hold afterwards (contract §14): exactly one instance owns
// the node — it holds the lock and wrote its record — and it is the survivor; the checkpoint
// reads and holds the node's claims unchanged; a new vGPU container is adjusted exactly once;
// the registry socket answers.
func TestHandoverCrashPoints(t *testing.T) {
	cases := []struct {
		victim, step string
	}{
		{"old", "fence"}, {"old", "fenced"}, {"old", "release"}, {"old", "released"},
		{"new", "validate"}, {"new", "take"}, {"new", "acquired"}, {"new", "owner"},
	}
	for _, tc := range cases {
		t.Run(tc.victim+"-at-"+tc.step, func(t *testing.T) {
			n := newNode(t)
			claims := crashClaims(t, n.cfg)
			uids := slices.Sorted(maps.Keys(claims))
			crashOld, crashNew := "", ""
			if tc.victim == "old" {
				crashOld = tc.step
			} else {
				crashNew = tc.step
			}
			old := startInstanceProc(t, n.cfg, claims, podOld, crashOld)
			old.waitLine(t, "owner")
			ctx := context.Background()
			// Until the runtime has added the owner's NRI connection, a container is created
			// without it (the test's runtime knows no required-plugins validation).
			pod, _ := crashContainer("before", uids[0], claims[uids[0]])
			if err := n.nri.runPod(ctx, pod); err != nil {
				t.Fatal(err)
			}
			for i := 0; ; i++ {
				_, ctr := crashContainer(fmt.Sprintf("before-%d", i), uids[0], claims[uids[0]])
				adj, err := n.nri.create(ctx, pod.Id, ctr)
				if err != nil {
					t.Fatalf("a container before the handover: %v", err)
				}
				if adjustedOnce(adj) {
					break
				}
				if err := n.nri.remove(ctx, ctr.Id); err != nil || i == 500 {
					t.Fatalf("the owner never adjusted a container: %v", err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			succ := startInstanceProc(t, n.cfg, claims, podNew, crashNew)
			victim, survivor := old, succ
			if tc.victim == "new" {
				victim, survivor = succ, old
			}
			eventually(t, time.Minute, "the victim to crash at "+tc.step, victim.exited)
			eventually(t, time.Minute, "the survivor to own the node", func() bool {
				return holds(n.cfg, survivor)
			})

			got, err := checkpoint.Load(n.cfg.CheckpointPath())
			if err != nil {
				t.Fatalf("the checkpoint after the crash: %v", err)
			}
			if !maps.EqualFunc(got.Claims, claims, func(a, b checkpoint.Claim) bool { return a.Name == b.Name && a.State == b.State }) {
				t.Errorf("the checkpoint after the crash holds %v, want the node's claims %v unchanged", slices.Sorted(maps.Keys(got.Claims)), uids)
			}
			pod2, ctr2 := crashContainer("after", uids[1], claims[uids[1]])
			if err := n.nri.runPod(ctx, pod2); err != nil {
				t.Fatal(err)
			}
			// The runtime may still have the dead instance registered for a moment; a container
			// created meanwhile proceeds without it (a closed connection drops a plugin).
			adj, err := n.nri.create(ctx, pod2.Id, ctr2)
			if err != nil || !adjustedOnce(adj) {
				t.Fatalf("a container after the crash: %v %v; want it adjusted exactly once by the survivor", adj, err)
			}
			if d := mountsOf(adj)[contract.ContainerConfigDir]; d == nil || !exists(filepath.Join(d.Source, contract.ContainerConfigName)) {
				t.Errorf("the container's vgpu.config is missing: %v", adj)
			}
			// The container is created, not started: the survivor's registry answers RETRY.
			resp, err := (&registry.Client{Socket: n.cfg.Layout().RegistrySocket()}).RegisterOnce(ctx, registry.Request{PodUID: pod2.Uid, ContainerName: "app"})
			if err != nil || resp.Status != registry.StatusRetry || !strings.Contains(resp.Message, "not started") {
				t.Errorf("the registry after the crash: %+v, %v; want the survivor's RETRY for a created container", resp, err)
			}
			if survivor.exited() {
				t.Error("the survivor exited")
			}
		})
	}
}

// holds reports whether p holds the node's lock now: the lock is held, its PID line is p's and
// its record names p's pod.
func holds(cfg plugin.Config, p *instanceProc) bool {
	h := instancelock.ReadHolder(cfg.InstanceLockPath())
	rec, ok := handover.ParseRecord(h.Record)
	if !ok || rec.PodUID != p.pod || h.PID != strconv.Itoa(p.cmd.Process.Pid) {
		return false
	}
	l, err := instancelock.TryAcquire(cfg.InstanceLockPath())
	if err == nil {
		_ = l.Release()
		return false
	}
	return errors.Is(err, instancelock.ErrHeld)
}
