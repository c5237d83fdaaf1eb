package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"google.golang.org/protobuf/proto"
)

// nriRuntime is containerd's side of NRI, built from its own adaptation package, with the pods
// and containers it knows as containerd would hold them: a created container carries the
// mounts and env that the plugins' adjustment gave it, and Synchronize replays them all.
type nriRuntime struct {
	r *adaptation.Adaptation

	mu    sync.Mutex
	state runtimeState
	// syncs counts plugin registrations: the runtime synchronizes every plugin that registers.
	syncs int
	// persist, when set, is called with the state after every change (child process).
	persist func(runtimeState)
}

// runtimeState is what the runtime knows, in creation order.
type runtimeState struct {
	Pods       []*api.PodSandbox `json:"pods"`
	Containers []*api.Container  `json:"containers"`
}

func newNRIRuntime(socket string, state runtimeState, opts ...adaptation.Option) (*nriRuntime, error) {
	rt := &nriRuntime{state: state}
	sync := func(ctx context.Context, cb adaptation.SyncCB) error {
		rt.mu.Lock()
		rt.syncs++
		// Copies: the replay is sent while other calls go on changing the containers.
		pods := make([]*api.PodSandbox, len(rt.state.Pods))
		for i, p := range rt.state.Pods {
			pods[i] = proto.Clone(p).(*api.PodSandbox)
		}
		ctrs := make([]*api.Container, len(rt.state.Containers))
		for i, c := range rt.state.Containers {
			ctrs[i] = proto.Clone(c).(*api.Container)
		}
		rt.mu.Unlock()
		_, err := cb(ctx, pods, ctrs)
		return err
	}
	update := func(context.Context, []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return nil, nil }
	opts = append([]adaptation.Option{adaptation.WithSocketPath(socket), adaptation.WithPluginPath(""), adaptation.WithPluginConfigPath("")}, opts...)
	r, err := adaptation.New("containerd", "v2.4.2", sync, update, opts...)
	if err != nil {
		return nil, err
	}
	if err := r.Start(); err != nil {
		return nil, err
	}
	rt.r = r
	return rt, nil
}

// startNRIRuntime runs a runtime in this process for the test's life.
func startNRIRuntime(t testing.TB, socket string, opts ...adaptation.Option) *nriRuntime {
	t.Helper()
	rt, err := newNRIRuntime(socket, runtimeState{}, opts...)
	if err != nil {
		t.Fatalf("start NRI runtime on %s: %v", socket, err)
	}
	t.Cleanup(rt.r.Stop)
	return rt
}

func (rt *nriRuntime) registrations() int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.syncs
}

func (rt *nriRuntime) changed() {
	if rt.persist != nil {
		rt.persist(rt.state)
	}
}

func (rt *nriRuntime) pod(id string) *api.PodSandbox {
	for _, p := range rt.state.Pods {
		if p.Id == id {
			return p
		}
	}
	return nil
}

func (rt *nriRuntime) container(id string) *api.Container {
	for _, c := range rt.state.Containers {
		if c.Id == id {
			return c
		}
	}
	return nil
}

// runPod makes the runtime know a pod.
func (rt *nriRuntime) runPod(ctx context.Context, pod *api.PodSandbox) error {
	if err := rt.r.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: pod}); err != nil {
		return err
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.pod(pod.Id) == nil {
		rt.state.Pods = append(rt.state.Pods, pod)
		rt.changed()
	}
	return nil
}

// create runs CreateContainer as containerd does and, on success, records the container with
// the adjustment applied (mounts appended, env set).
func (rt *nriRuntime) create(ctx context.Context, podID string, ctr *api.Container) (*api.ContainerAdjustment, error) {
	rt.mu.Lock()
	pod := rt.pod(podID)
	rt.mu.Unlock()
	if pod == nil {
		return nil, fmt.Errorf("no pod %s", podID)
	}
	ctr.PodSandboxId, ctr.State = podID, api.ContainerState_CONTAINER_CREATED
	if ctr.CreatedAt == 0 {
		ctr.CreatedAt = time.Now().UnixNano()
	}
	resp, err := rt.r.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: ctr})
	if err != nil {
		return nil, err
	}
	adj := resp.GetAdjust()
	for _, m := range adj.GetMounts() {
		ctr.Mounts = append(ctr.Mounts, m)
	}
	for _, kv := range adj.GetEnv() {
		ctr.Env = append(slices.DeleteFunc(ctr.Env, func(e string) bool { return len(e) > len(kv.Key) && e[:len(kv.Key)+1] == kv.Key+"=" }), kv.Key+"="+kv.Value)
	}
	rt.mu.Lock()
	rt.state.Containers = append(rt.state.Containers, ctr)
	rt.changed()
	rt.mu.Unlock()
	// As containerd: once created, the container as it is (with the adjustment) goes to every
	// plugin; an observing instance learns the owner's containers from it (contract §14).
	if err := rt.r.PostCreateContainer(ctx, &api.PostCreateContainerRequest{Pod: pod, Container: ctr}); err != nil {
		return adj, fmt.Errorf("PostCreateContainer: %w", err)
	}
	return adj, nil
}

func (rt *nriRuntime) start(ctx context.Context, id string, pid uint32) error {
	rt.mu.Lock()
	ctr := rt.container(id)
	if ctr == nil {
		rt.mu.Unlock()
		return fmt.Errorf("no container %s", id)
	}
	ctr.Pid, ctr.State, ctr.StartedAt = pid, api.ContainerState_CONTAINER_RUNNING, time.Now().UnixNano()
	pod := rt.pod(ctr.PodSandboxId)
	rt.changed()
	rt.mu.Unlock()
	return rt.r.StartContainer(ctx, &api.StartContainerRequest{Pod: pod, Container: ctr})
}

func (rt *nriRuntime) stop(ctx context.Context, id string) error {
	rt.mu.Lock()
	ctr := rt.container(id)
	if ctr == nil {
		rt.mu.Unlock()
		return fmt.Errorf("no container %s", id)
	}
	ctr.State, ctr.Pid = api.ContainerState_CONTAINER_STOPPED, 0
	pod := rt.pod(ctr.PodSandboxId)
	rt.changed()
	rt.mu.Unlock()
	_, err := rt.r.StopContainer(ctx, &api.StopContainerRequest{Pod: pod, Container: ctr})
	return err
}

func (rt *nriRuntime) remove(ctx context.Context, id string) error {
	rt.mu.Lock()
	ctr := rt.container(id)
	if ctr == nil {
		rt.mu.Unlock()
		return fmt.Errorf("no container %s", id)
	}
	rt.state.Containers = slices.DeleteFunc(rt.state.Containers, func(c *api.Container) bool { return c.Id == id })
	pod := rt.pod(ctr.PodSandboxId)
	rt.changed()
	rt.mu.Unlock()
	return rt.r.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: pod, Container: ctr})
}

// runtimeCmd is one command to a runtime in a child process, and its answer.
type runtimeCmd struct {
	Op    string          `json:"op"` // pod, create, start, stop, remove, bench
	Pod   *api.PodSandbox `json:"pod,omitempty"`
	PodID string          `json:"podID,omitempty"`
	Ctr   *api.Container  `json:"ctr,omitempty"`
	ID    string          `json:"id,omitempty"`
	PID   uint32          `json:"pid,omitempty"`
	N     int             `json:"n,omitempty"`
}

type runtimeAnswer struct {
	Err       string                   `json:"err,omitempty"`
	Adjust    *api.ContainerAdjustment `json:"adjust,omitempty"`
	Latencies []time.Duration          `json:"latencies,omitempty"`
}

// runtimeChild is the child process's main: a runtime on $VGPU_NRI_SOCKET that replays and
// records its state in $VGPU_NRI_STATE and obeys commands on stdin, one JSON line each.
func runtimeChild() error {
	socket, statePath := os.Getenv("VGPU_NRI_SOCKET"), os.Getenv("VGPU_NRI_STATE")
	if d, err := time.ParseDuration(os.Getenv("VGPU_NRI_TIMEOUT")); err == nil {
		adaptation.SetPluginRequestTimeout(d)
	}
	var state runtimeState
	if b, err := os.ReadFile(statePath); err == nil {
		if err := json.Unmarshal(b, &state); err != nil {
			return fmt.Errorf("read runtime state: %w", err)
		}
	}
	rt, err := newNRIRuntime(socket, state)
	if err != nil {
		return err
	}
	rt.persist = func(s runtimeState) {
		b, _ := json.Marshal(s)
		tmp := statePath + ".tmp"
		if os.WriteFile(tmp, b, 0o600) == nil {
			_ = os.Rename(tmp, statePath)
		}
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := json.NewEncoder(os.Stdout)
	ctx := context.Background()
	for in.Scan() {
		var cmd runtimeCmd
		var ans runtimeAnswer
		if err := json.Unmarshal(in.Bytes(), &cmd); err != nil {
			return err
		}
		switch cmd.Op {
		case "pod":
			err = rt.runPod(ctx, cmd.Pod)
		case "create":
			ans.Adjust, err = rt.create(ctx, cmd.PodID, cmd.Ctr)
		case "start":
			err = rt.start(ctx, cmd.ID, cmd.PID)
		case "stop":
			err = rt.stop(ctx, cmd.ID)
		case "remove":
			err = rt.remove(ctx, cmd.ID)
		case "bench":
			ans.Latencies, err = rt.bench(ctx, cmd.PodID, cmd.Ctr, cmd.N)
		default:
			err = fmt.Errorf("unknown op %q", cmd.Op)
		}
		if err != nil {
			ans.Err = err.Error()
		}
		if err := out.Encode(ans); err != nil {
			return err
		}
	}
	return in.Err()
}

// bench times n CreateContainer round trips of copies of ctr, each with its own ID, removing
// each container afterwards (untimed) so that the plugin's state does not grow.
func (rt *nriRuntime) bench(ctx context.Context, podID string, ctr *api.Container, n int) ([]time.Duration, error) {
	rt.mu.Lock()
	pod := rt.pod(podID)
	rt.mu.Unlock()
	lat := make([]time.Duration, 0, n)
	for i := range n {
		c := proto.Clone(ctr).(*api.Container)
		c.Id, c.PodSandboxId = fmt.Sprintf("bench-%d", i), podID
		start := time.Now()
		if _, err := rt.r.CreateContainer(ctx, &api.CreateContainerRequest{Pod: pod, Container: c}); err != nil {
			return nil, err
		}
		lat = append(lat, time.Since(start))
		if _, err := rt.r.StopContainer(ctx, &api.StopContainerRequest{Pod: pod, Container: c}); err != nil {
			return nil, err
		}
		if err := rt.r.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: pod, Container: c}); err != nil {
			return nil, err
		}
	}
	return lat, nil
}
