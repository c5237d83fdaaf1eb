package nri

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// DefaultRefreshTimeout bounds the one API read of a claim on a reservedFor miss: a plugin
// that overruns the runtime's request timeout (2 s by default) is dropped by the runtime.
const DefaultRefreshTimeout = 500 * time.Millisecond

// Config is the plugin's plain configuration.
type Config struct {
	// DriverName is the DRA driver name, the vendor of the claim CDI devices (--driver-name);
	// contract.DefaultDriverName when empty.
	DriverName string
	// Layout is the host directory layout (--state-dir).
	Layout claimdir.Layout
	// RefreshTimeout bounds the API read on a reservedFor miss; DefaultRefreshTimeout when 0.
	RefreshTimeout time.Duration
	// ProcRoot is where /proc is (tests point it elsewhere); "/proc" when empty.
	ProcRoot string
	// SetNvidiaVisibleDevices gives each container NVIDIA_VISIBLE_DEVICES with exactly the GPUs
	// of its results (--gpu-injection=env): the results' CDI devices each name one GPU, and
	// CDI keeps one value of a variable (contract §3, §4).
	SetNvidiaVisibleDevices bool
	// StopProcess stops a vGPU container that the runtime created without the plugin's
	// adjustment (stray.go), given its init PID and container ID; StopContainerProcess over
	// ProcRoot when nil.
	StopProcess func(pid int, containerID string) error
}

// Plugin implements the NRI hooks (the stub's handler interfaces). One Plugin serves every
// connection the Supervisor makes; the runtime serializes the calls of one connection.
type Plugin struct {
	cfg Config
	// claims is what the plugin asks about prepared claims; replaced when this instance becomes
	// the owner (Own) and reads the checkpoint anew.
	claims  Claims
	cache   *Cache
	view    *runtimeView
	metrics *metrics.NRIMetrics
	logger  klog.Logger
	// inflight counts hook calls in progress; Supervisor.Drain waits for it.
	inflight inflight
	// cgroupReads tracks the background work after a Synchronize: reading cgroups, stopping
	// strays.
	cgroupReads sync.WaitGroup

	mu        sync.Mutex
	runtime   string // "<name> <version>" from the last Configure
	onSynced  func() // the Supervisor's notification of a good session
	ownership Ownership
	decisions Decisions

	// ownMu orders Own against Synchronize's choice between owner and observer and against
	// StartContainer's record of a start; ownOnSync is set
	// when this instance became the owner before the runtime's first Synchronize reached it:
	// that Synchronize builds the cache, whatever the ownership says at that instant.
	ownMu     sync.Mutex
	ownOnSync bool
}

// NewPlugin returns the hooks over claims, with an empty, unsynchronized cache.
func NewPlugin(cfg Config, claims Claims, m *metrics.NRIMetrics, logger klog.Logger) *Plugin {
	if cfg.RefreshTimeout <= 0 {
		cfg.RefreshTimeout = DefaultRefreshTimeout
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.DriverName == "" {
		cfg.DriverName = contract.DefaultDriverName
	}
	if cfg.StopProcess == nil {
		procRoot := cfg.ProcRoot
		cfg.StopProcess = func(pid int, containerID string) error { return StopContainerProcess(procRoot, pid, containerID) }
	}
	return &Plugin{cfg: cfg, claims: claims, cache: NewCache(), view: newRuntimeView(), metrics: m, logger: logger,
		ownership: soleOwner{}, decisions: noDecisions{}}
}

// Cache is the plugin's container cache (read by the registry server).
func (p *Plugin) Cache() *Cache { return p.cache }

// Runtime is the runtime's name and version from the last Configure ("" before one).
func (p *Plugin) Runtime() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.runtime
}

func (p *Plugin) setOnSynced(fn func()) {
	p.mu.Lock()
	p.onSynced = fn
	p.mu.Unlock()
}

func (p *Plugin) observe(hook string, start time.Time) {
	p.metrics.HookDuration.WithLabelValues(hook).Observe(time.Since(start).Seconds())
}

// errAbandoned fails the Configure with which the supervisor releases an abandoned Start.
var errAbandoned = errors.New("connection attempt abandoned by the watchdog")

// Configure records the runtime; the events are the hooks Plugin implements.
func (p *Plugin) Configure(ctx context.Context, _, runtimeName, runtimeVersion string) (api.EventMask, error) {
	if ctx.Value(abandonedKey{}) != nil {
		return 0, errAbandoned
	}
	p.mu.Lock()
	p.runtime = runtimeName + " " + runtimeVersion
	p.mu.Unlock()
	p.logger.Info("NRI runtime configured the plugin", "runtime", runtimeName, "version", runtimeVersion)
	return 0, nil
}

// StartContainer records the container's init PID and cgroup, which the registry needs to
// check that a registration comes from inside the container.
func (p *Plugin) StartContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	return p.recordStart(pod, ctr, true)
}

// PostStartContainer records the same once the container runs. It is what an instance that
// connected to NRI while a container was starting learns its PID from: the runtime ran the
// StartContainer hook before this instance's Synchronize, whose snapshot still had the
// container created, without a PID; without this, the container's registrations got RETRY
// until the next Synchronize (e2e TestUpgradeWithoutGap, a churned pod at a rollback).
func (p *Plugin) PostStartContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	if ctr.GetPid() <= 0 {
		return nil
	}
	if in, ok := p.cache.Get(ctr.GetId()); ok && in.PID == int(ctr.GetPid()) {
		return nil // StartContainer recorded it
	}
	return p.recordStart(pod, ctr, false)
}

func (p *Plugin) recordStart(pod *api.PodSandbox, ctr *api.Container, hook bool) error {
	p.inflight.enterAlways()
	defer p.inflight.leave()
	start := time.Now()
	// Ordered with Own (ownMu): either Own's snapshot of the view holds this start, or Own's
	// rebuilt cache is in place before the update below. Own runs a moment before the gates
	// say this instance owns the node, so a start in between is recorded into the cache
	// whatever ownership says now; only learning new containers is the owner's.
	p.ownMu.Lock()
	p.view.saw(pod, ctr)
	ownership, _ := p.owner()
	owns := ownership.Owns()
	p.ownMu.Unlock()
	if owns {
		p.learn(pod, ctr)
	}
	if _, ok := p.cache.Get(ctr.GetId()); !ok {
		return nil // not a vGPU container, or not one this instance's cache holds
	}
	pid := int(ctr.GetPid())
	var cg Cgroup
	var cgErr error
	if pid > 0 {
		cg, cgErr = readCgroup(p.cfg.ProcRoot, pid)
	}
	if !p.cache.update(ctr.GetId(), func(in *Instance) {
		in.PID, in.Cgroup, in.State = pid, cg, StateRunning
	}) {
		return nil // removed meanwhile
	}
	if hook {
		defer p.observe(metrics.HookStartContainer, start)
	}
	if pid <= 0 || cgErr != nil {
		// Registrations of this container get RETRY until a Synchronize replays its PID.
		p.metrics.Failures.WithLabelValues(metrics.HookStartContainer).Inc()
		p.logger.Error(cgErr, "No cgroup for a started vGPU container", "pod", klog.KRef(pod.GetNamespace(), pod.GetName()), "container", ctr.GetName(), "pid", pid)
	}
	return nil
}

// PostCreateContainer records the container as the runtime created it, with the mounts and env
// of the adjustment: an observer learns from it the containers the owner decided, and an owner
// the ones its predecessor decided just before the node changed hands (contract §14).
func (p *Plugin) PostCreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.inflight.enterAlways()
	defer p.inflight.leave()
	p.view.saw(pod, ctr)
	if ownership, _ := p.owner(); ownership.Owns() {
		p.learn(pod, ctr)
	}
	return nil
}

// StopContainer marks the instance stopped: its results are free for other containers.
func (p *Plugin) StopContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	p.inflight.enterAlways()
	defer p.inflight.leave()
	start := time.Now()
	p.view.stopped(pod, ctr)
	if p.cache.update(ctr.GetId(), func(in *Instance) { in.State = StateStopped }) {
		p.observe(metrics.HookStopContainer, start)
	}
	return nil, nil
}

// RemoveContainer drops the instance by container ID (also the undo of a failed creation)
// and removes the directory when no instance of that pod and name remains. It never fails
// the CRI call.
func (p *Plugin) RemoveContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.inflight.enterAlways()
	defer p.inflight.leave()
	start := time.Now()
	p.view.removed(ctr)
	ownership, decisions := p.owner()
	in, last, ok := p.cache.remove(ctr.GetId())
	if !ok {
		return nil
	}
	decisions.Forget(ctr.GetId())
	defer p.observe(metrics.HookRemoveContainer, start)
	p.metrics.CacheEntries.Set(float64(p.cache.Len()))
	// An observer's cache is not the node's: the owner may have given another instance of the
	// name the directory since.
	if last && ownership.Owns() {
		p.removeDirs(metrics.HookRemoveContainer, in)
	}
	p.logger.V(2).Info("Removed vGPU container", "pod", klog.KRef(pod.GetNamespace(), pod.GetName()), "container", in.ContainerName, "id", in.ContainerID, "dirRemoved", last)
	return nil
}

// StopPodSandbox marks the pod's instances stopped and removes the pod's directories
// (contract §4). It never fails the CRI call.
func (p *Plugin) StopPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	p.inflight.enterAlways()
	defer p.inflight.leave()
	start := time.Now()
	p.view.podStopped(pod)
	stopped := p.cache.stopPod(pod.GetUid())
	if ownership, _ := p.owner(); len(stopped) == 0 || !ownership.Owns() {
		return nil
	}
	defer p.observe(metrics.HookStopPodSandbox, start)
	done := map[nameKey]bool{}
	for _, in := range stopped {
		if k := (nameKey{in.PodUID, in.ContainerName}); !done[k] {
			done[k] = true
			p.removeDirs(metrics.HookStopPodSandbox, in)
		}
	}
	return nil
}

func (p *Plugin) removeDirs(hook string, in Instance) {
	if err := p.cfg.Layout.RemoveContainerDirs(in.ClaimUID, in.PodUID, in.ContainerName); err != nil {
		p.metrics.Failures.WithLabelValues(hook).Inc()
		p.logger.Error(err, "Removing a vGPU container's directory failed", "podUID", in.PodUID, "container", in.ContainerName, "claim", in.ClaimUID)
	}
}
