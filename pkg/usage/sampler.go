package usage

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

// Defaults of Config.
const (
	// DefaultInterval is how often the node is sampled: well below a typical scrape interval
	// (15-30 s), so a scrape sees figures a few seconds old at most, and rare enough that
	// reading every ledger costs nothing measurable (docs/performance.md).
	DefaultInterval = 5 * time.Second
	// DefaultMaxSeries bounds the (container, GPU) rows of a snapshot, and with them the
	// per-container series (contract §8): a node that shares its GPUs in 256 MiB steps could
	// otherwise export thousands.
	DefaultMaxSeries = 1024
)

// Sources of read errors (label "source" of usage_read_errors_total).
const (
	SourceConfig = "config"
	SourcePIDs   = "pids"
	SourceLedger = "ledger"
	SourceNVML   = "nvml"
)

// NVML is what the sampler asks the GPUs: per-process samples (gpu.Source has them).
type NVML interface {
	ProcessUtilization(uuid string, since uint64) ([]gpu.ProcessSample, error)
	ProcessMemory(uuid string) ([]gpu.ProcessMemory, error)
}

// Config is the sampler's plain configuration.
type Config struct {
	// Interval between samples; DefaultInterval when zero.
	Interval time.Duration
	// MaxSeries bounds the (container, GPU) rows; DefaultMaxSeries when zero.
	MaxSeries int
}

// Deps are where the sampler's figures come from; the plugin supplies adapters, tests fakes.
type Deps struct {
	// Targets lists the containers (NRI path) and claims (per-claim path) to read.
	Targets func() []Target
	// GPUs lists the node's GPUs with what is published and allocated.
	GPUs func() []GPU
	NVML NVML
	// Allowance is the compute arbiter's current allowance of a target (Target.Key) on a GPU,
	// percent; false when it has none (no arbiter, or none divided the GPU for it yet). May be
	// nil: no allowances.
	Allowance func(key, gpu string) (float64, bool)
	// ReadError counts a failed read by source; may be nil.
	ReadError func(source string)
	// Observe records how long one sample took; may be nil.
	Observe func(time.Duration)
	// Published is called with every new snapshot, in the sampler's goroutine
	// (Collector.Prepare); may be nil.
	Published func(*Snapshot)
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Sampler reads every target's files and NVML in the background and publishes a Snapshot.
// Nothing it does holds a lock that a registration or an NRI hook takes: Targets returns a
// copy, and the files are read without locks (see LedgerReader).
type Sampler struct {
	cfg  Config
	deps Deps

	snap atomic.Pointer[Snapshot]
	// simulated is the current sample's processes per GPU, for the simulated GPUs.
	simulated atomic.Pointer[map[string][]gpu.SimulatedProcess]

	// sampling serialises Sample (Run's ticks, a test's explicit sample); what follows is
	// owned by the sample in progress.
	sampling sync.Mutex
	ledgers  LedgerReader
	lastSeen map[string]uint64 // per GPU: newest NVML sample timestamp seen
	logged   map[string]bool   // per error text: logged once
}

// NewSampler returns a sampler with an empty snapshot; Run or Sample fills it.
func NewSampler(cfg Config, deps Deps) *Sampler {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.MaxSeries <= 0 {
		cfg.MaxSeries = DefaultMaxSeries
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	s := &Sampler{cfg: cfg, deps: deps, lastSeen: map[string]uint64{}, logged: map[string]bool{}}
	s.snap.Store(&Snapshot{})
	return s
}

// Run samples at once and then every interval until ctx ends.
func (s *Sampler) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		s.Sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Snapshot is the latest sample; never nil, never changed.
func (s *Sampler) Snapshot() *Snapshot { return s.snap.Load() }

// SimulatedProcessesOn lists the processes of the targets whose vgpu.config names the GPU, as
// of the latest sample, each with its share of the container's core limit there: the processes
// a simulated GPU runs (gpu.Simulated.SetProcesses).
func (s *Sampler) SimulatedProcessesOn(uuid string) []gpu.SimulatedProcess {
	m := s.simulated.Load()
	if m == nil {
		return nil
	}
	return (*m)[uuid]
}

// addSimulated adds a container's processes on a simulated GPU, each with its share of the
// container's cores. A process two targets list (only a test's own) keeps the smaller share.
func addSimulated(procs []gpu.SimulatedProcess, pids []int, cores int64) []gpu.SimulatedProcess {
	share := 0.0
	if cores > 0 && cores < 100 {
		share = float64(cores) / float64(len(pids))
	}
	for _, pid := range pids {
		i := slices.IndexFunc(procs, func(p gpu.SimulatedProcess) bool { return p.PID == pid })
		switch {
		case i < 0:
			procs = append(procs, gpu.SimulatedProcess{PID: pid, CoreShare: share})
		case share > 0 && (procs[i].CoreShare == 0 || share < procs[i].CoreShare):
			procs[i].CoreShare = share
		}
	}
	return procs
}

// targetFiles is what one target's files say.
type targetFiles struct {
	Target
	cfg       contract.ContainerConfig
	pids      []int
	ledger    Ledger
	hasLedger bool
	// noLedger: there is no ledger file (none of the container's processes used CUDA with a
	// limit yet); a ledger that is there but cannot be read is neither.
	noLedger bool
}

// Sample reads everything once and publishes the snapshot. Concurrent calls take turns.
func (s *Sampler) Sample(ctx context.Context) {
	s.sampling.Lock()
	defer s.sampling.Unlock()
	start := s.deps.Now()
	logger := klog.FromContext(ctx)
	files := s.readTargets(logger)
	pidsByGPU := map[string][]int{}
	simulated := map[string][]gpu.SimulatedProcess{}
	for _, f := range files {
		for _, g := range f.cfg.GPUs {
			pidsByGPU[g.UUID] = append(pidsByGPU[g.UUID], f.pids...)
			simulated[g.UUID] = addSimulated(simulated[g.UUID], f.pids, g.Cores)
		}
	}
	s.simulated.Store(&simulated)
	gpus := s.deps.GPUs()
	byUUID := make(map[string]*GPUUsage, len(gpus))
	snap := &Snapshot{Taken: start, GPUs: make([]GPUUsage, len(gpus))}
	for i, g := range gpus {
		snap.GPUs[i] = GPUUsage{GPU: g}
		byUUID[g.UUID] = &snap.GPUs[i]
	}
	nv := s.readNVML(logger, pidsByGPU)
	refusals := map[Refusals]float64{}
	for _, f := range files {
		// Every target has the counter, 0 until a refusal: a series that only appeared with its
		// first refusal would hide that refusal from increase() and rate().
		if f.hasLedger || f.noLedger {
			refusals[Refusals{Namespace: f.Namespace, Pod: f.Pod, Container: f.Container, Claim: f.Claim}] = float64(f.ledger.Refused)
		}
		for pos, g := range f.cfg.GPUs {
			row := s.row(f, pos, g, byUUID[g.UUID], nv[g.UUID])
			snap.Containers = append(snap.Containers, row)
			if u := byUUID[g.UUID]; u != nil {
				u.Containers++
			}
		}
	}
	slices.SortFunc(snap.Containers, compareRows)
	if n := len(snap.Containers); n > s.cfg.MaxSeries {
		snap.Omitted = n - s.cfg.MaxSeries
		snap.Containers = snap.Containers[:s.cfg.MaxSeries:s.cfg.MaxSeries]
		s.logOnce(logger, "bound", errors.New("more (container, GPU) pairs than the series bound"), "bound", s.cfg.MaxSeries, "omitted", snap.Omitted)
	}
	for _, r := range snap.Containers { // the bound applies to the refusal counters too
		key := Refusals{Namespace: r.Namespace, Pod: r.Pod, Container: r.Container, Claim: r.Claim}
		if count, ok := refusals[key]; ok {
			key.Count = count
			snap.Refusals = append(snap.Refusals, key)
			delete(refusals, key.identity())
		}
	}
	s.snap.Store(snap)
	if s.deps.Published != nil {
		s.deps.Published(snap)
	}
	if s.deps.Observe != nil {
		s.deps.Observe(s.deps.Now().Sub(start))
	}
}

// readTargets reads every target's vgpu.config, pids.config and ledger. A target whose
// vgpu.config cannot be read is left out (nothing says which GPUs it has); the other files'
// failures leave out only what they would have given.
func (s *Sampler) readTargets(logger klog.Logger) []targetFiles {
	targets := s.deps.Targets()
	out := make([]targetFiles, 0, len(targets))
	for _, t := range targets {
		f := targetFiles{Target: t}
		var err error
		if f.cfg, err = readConfig(t.ConfigDir); err != nil {
			s.readFailed(logger, SourceConfig, err)
			continue
		}
		if f.pids, err = readPIDs(t.ConfigDir); err != nil {
			s.readFailed(logger, SourcePIDs, err)
		}
		switch f.ledger, err = s.ledgers.Read(t.VMemNodeDir); {
		case err == nil:
			f.hasLedger = true
		case errors.Is(err, ErrNoLedger):
			f.noLedger = true
		default:
			s.readFailed(logger, SourceLedger, err)
		}
		out = append(out, f)
	}
	return out
}

// gpuSample is what NVML said of one GPU's processes in this sample.
type gpuSample struct {
	util    map[int]uint32 // by PID; valid when utilOK
	utilOK  bool
	mem     map[int]gpu.ProcessMemory
	memOK   bool
	touched bool
}

// readNVML asks NVML about every GPU that runs a target's process.
func (s *Sampler) readNVML(logger klog.Logger, pidsByGPU map[string][]int) map[string]gpuSample {
	out := make(map[string]gpuSample, len(pidsByGPU))
	for uuid, pids := range pidsByGPU {
		if len(pids) == 0 {
			continue
		}
		g := gpuSample{touched: true}
		if samples, err := s.deps.NVML.ProcessUtilization(uuid, s.lastSeen[uuid]); err != nil {
			s.readFailed(logger, SourceNVML, err)
		} else {
			g.util, g.utilOK = make(map[int]uint32, len(samples)), true
			for _, p := range samples {
				g.util[p.PID] = p.SMUtil
				s.lastSeen[uuid] = max(s.lastSeen[uuid], p.TimeStamp)
			}
		}
		if procs, err := s.deps.NVML.ProcessMemory(uuid); err != nil {
			s.readFailed(logger, SourceNVML, err)
		} else {
			g.mem, g.memOK = make(map[int]gpu.ProcessMemory, len(procs)), true
			for _, p := range procs {
				g.mem[p.PID] = p
			}
		}
		out[uuid] = g
	}
	return out
}

// row builds one (target, GPU) row from the target's files and NVML's answers.
func (s *Sampler) row(f targetFiles, pos int, g contract.ContainerGPU, state *GPUUsage, nv gpuSample) ContainerGPU {
	r := ContainerGPU{Namespace: f.Namespace, Pod: f.Pod, Container: f.Container, Claim: f.Claim, GPU: g.UUID,
		MemoryLimit: float64(g.MemoryBytes), CoresLimit: float64(g.Cores)}
	if g.MemoryBytes == 0 && state != nil {
		r.MemoryLimit = float64(state.PublishedMemory)
	}
	if g.Cores == 0 || g.Cores > 100 {
		r.CoresLimit = 100
	}
	r.CoresCeiling = r.CoresLimit
	if terms, ok := f.Compute[g.UUID]; ok {
		r.Class, r.CoresCeiling = terms.Class, max(terms.Ceiling, r.CoresLimit)
	}
	if s.deps.Allowance != nil && f.Key != "" {
		r.CoresAllowance, r.HasCoresAllowance = s.deps.Allowance(f.Key, g.UUID)
	}
	limited := slices.ContainsFunc(f.cfg.GPUs, func(c contract.ContainerGPU) bool { return c.MemoryBytes > 0 || (c.Cores > 0 && c.Cores < 100) })
	switch {
	case f.hasLedger && pos < len(f.ledger.Used):
		r.MemoryUsed, r.HasMemoryUsed = float64(f.ledger.Used[pos]), true
	case f.noLedger && limited:
		r.HasMemoryUsed = true // the library creates the ledger on the first CUDA call: nothing used yet
	}
	if !nv.touched { // no process of any target on this GPU: nothing runs
		r.HasCoresUsed, r.HasMemoryNVML = true, true
		return r
	}
	if nv.utilOK {
		var sum uint32
		for _, pid := range f.pids {
			sum += nv.util[pid]
		}
		r.CoresUsed, r.HasCoresUsed = float64(min(sum, 100)), true
	}
	if nv.memOK {
		r.HasMemoryNVML = true
		for _, pid := range f.pids {
			p, listed := nv.mem[pid]
			if listed && !p.Known {
				r.HasMemoryNVML = false
				break
			}
			r.MemoryNVML += float64(p.UsedBytes)
		}
		if !r.HasMemoryNVML {
			r.MemoryNVML = 0
		}
	}
	return r
}

func (s *Sampler) readFailed(logger klog.Logger, source string, err error) {
	if s.deps.ReadError != nil {
		s.deps.ReadError(source)
	}
	s.logOnce(logger, source, err)
}

// logOnce logs each distinct error once: a broken ledger is read again every interval, and a
// log line every 5 s per container would drown the plugin's log.
func (s *Sampler) logOnce(logger klog.Logger, source string, err error, kv ...any) {
	key := source + ": " + err.Error()
	if s.logged[key] {
		return
	}
	if len(s.logged) < 1024 {
		s.logged[key] = true
	}
	logger.Error(err, "Reading container usage for metrics failed; its series are left out until it reads again (logged once)", append([]any{"source", source}, kv...)...)
}
