package nri

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// Defaults of SupervisorConfig.
const (
	DefaultSocket           = "/var/run/nri/nri.sock"
	DefaultPluginIndex      = "00"
	DefaultFailureGrace     = 3 * time.Minute
	DefaultStartTimeout     = 10 * time.Second
	DefaultFirstAttemptWait = 2 * time.Second
	initialBackoff          = 50 * time.Millisecond
	maxBackoff              = time.Second
)

// SupervisorConfig configures the connection's life. Zero values mean the defaults.
type SupervisorConfig struct {
	// PluginName is the driver name (contract §1); the runtime sees "<index>-<name>".
	PluginName  string
	PluginIndex string
	Socket      string
	// FailureGrace is how long a process that has had a good session may stay disconnected
	// before Check reports it unhealthy (--nri-failure-grace).
	FailureGrace time.Duration
	// StartTimeout is the watchdog around one connection attempt: the stub's Start blocks
	// forever when the runtime dies between registration and configuration.
	StartTimeout time.Duration
	// FirstAttemptWait bounds how long ClaimPath waits for the outcome of the first attempt.
	FirstAttemptWait time.Duration
	// NoFailRequest registers without NRI's FailRequest failure policy. An instance that may
	// hand the node over sets it (contract §14): a runtime that honours the policy (NRI ≥
	// 0.12.4) fails any request that a FailRequest plugin's closing connection is under, and
	// the outgoing instance must be able to close its connection without failing a container
	// that the new owner adjusts.
	NoFailRequest bool
}

// Supervisor keeps the plugin connected to the runtime: a fresh stub for every attempt (a
// stub whose start failed keeps a dead connection, and every retry on it fails even against
// a healthy runtime), a watchdog around start, and retries forever with jittered exponential
// backoff capped at about a second. "Socket missing" and "connection refused" are the same
// retry: the runtime is (re)starting, or does not offer NRI at all.
type Supervisor struct {
	cfg     SupervisorConfig
	plugin  *Plugin
	metrics *metrics.NRIMetrics
	logger  klog.Logger
	now     func() time.Time

	firstDone chan struct{}
	firstOnce sync.Once

	// stop ends Run (set by Run); done is closed when Run has returned, its last session
	// closed.
	stop context.CancelFunc
	done chan struct{}

	mu     sync.Mutex
	status Status
}

// Status is the connection's state, as the debug endpoint shows it.
type Status struct {
	Socket string `json:"socket"`
	Plugin string `json:"plugin"`
	// Connected: registered and configured by the runtime.
	Connected bool `json:"connected"`
	// Synced: the current session's Synchronize succeeded (a good session).
	Synced bool `json:"synced"`
	// HadSession: this process has had a good session.
	HadSession bool `json:"hadSession"`
	// LostAt is when the last good session ended (zero while one lasts or before the first).
	LostAt    time.Time `json:"lostAt,omitzero"`
	Attempts  int       `json:"attempts"`
	Sessions  int       `json:"sessions"`
	LastError string    `json:"lastError,omitempty"`
	Runtime   string    `json:"runtime,omitempty"`
}

// NewSupervisor returns a supervisor for plugin; Run starts it.
func NewSupervisor(cfg SupervisorConfig, plugin *Plugin, m *metrics.NRIMetrics, logger klog.Logger) *Supervisor {
	if cfg.PluginIndex == "" {
		cfg.PluginIndex = DefaultPluginIndex
	}
	if cfg.Socket == "" {
		cfg.Socket = DefaultSocket
	}
	if cfg.FailureGrace <= 0 {
		cfg.FailureGrace = DefaultFailureGrace
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	if cfg.FirstAttemptWait <= 0 {
		cfg.FirstAttemptWait = DefaultFirstAttemptWait
	}
	s := &Supervisor{cfg: cfg, plugin: plugin, metrics: m, logger: logger, now: time.Now, firstDone: make(chan struct{}), done: make(chan struct{})}
	s.status.Socket = cfg.Socket
	s.status.Plugin = cfg.PluginIndex + "-" + cfg.PluginName
	return s
}

// UsePluginIndex sets the NRI plugin index (two digits) before Run: a successor registers one
// index after the owner, so that the runtime calls the owner first (contract §14).
func (s *Supervisor) UsePluginIndex(idx string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg.PluginIndex = idx
	s.status.Plugin = idx + "-" + s.cfg.PluginName
}

// PluginIndex is the NRI plugin index in use.
func (s *Supervisor) PluginIndex() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.PluginIndex
}

// Synced reports whether the current session is good (registered and synchronized).
func (s *Supervisor) Synced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status.Connected && s.status.Synced
}

// FirstAttemptDone is closed once the first connection attempt has an outcome.
func (s *Supervisor) FirstAttemptDone() <-chan struct{} { return s.firstDone }

// Run connects and reconnects until ctx ends or Drain stops it. Give it a context that a
// shutdown does not cancel before Drain has run: cancelling it closes the connection at once,
// under any request in flight.
func (s *Supervisor) Run(ctx context.Context) {
	defer close(s.done)
	ctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	s.stop = cancel
	s.mu.Unlock()
	defer cancel()
	backoff := initialBackoff
	quiet := false // after the first failure in a row, failures are logged at V(4)
	for ctx.Err() == nil {
		established, err := s.session(ctx)
		s.firstOnce.Do(func() { close(s.firstDone) })
		switch {
		case established:
			backoff, quiet = initialBackoff, false
		case err != nil && ctx.Err() == nil:
			if !quiet {
				s.logger.Info("NRI runtime not reachable; retrying (new claims take the per-claim path until a first session)", "socket", s.cfg.Socket, "err", err)
				quiet = true
			} else {
				s.logger.V(4).Info("NRI connection attempt failed", "err", err)
			}
		}
		// Jitter: 75–125 % of the backoff, so that plugins do not reconnect in lockstep.
		wait := backoff*3/4 + rand.N(backoff/2+1)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// session makes one connection attempt with a fresh stub and, when it succeeds, lasts until
// the connection closes or ctx ends.
func (s *Supervisor) session(ctx context.Context) (established bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	closed := make(chan struct{})
	var closeOnce sync.Once
	d := &dialer{}
	st, err := stub.New(s.plugin,
		stub.WithPluginName(s.cfg.PluginName), stub.WithPluginIdx(s.PluginIndex()),
		stub.WithSocketPath(s.cfg.Socket), stub.WithDialer(d.dial),
		stub.WithOnClose(func() { closeOnce.Do(func() { close(closed) }) }),
		stub.WithLogger(nriLogger{s.logger}),
		// Fail the request rather than proceed without us (runtimes with NRI ≥ 0.12.4; older
		// ones ignore the field — see the package documentation).
		stub.WithFailurePolicy(&api.FailurePolicy{FailRequest: !s.cfg.NoFailRequest}),
	)
	if err != nil {
		return false, fmt.Errorf("create NRI stub: %w", err)
	}
	s.plugin.setOnSynced(s.synced)
	s.mu.Lock()
	s.status.Attempts++
	s.mu.Unlock()

	if err := s.start(sctx, st, d); err != nil {
		s.mu.Lock()
		s.status.LastError = err.Error()
		s.mu.Unlock()
		return false, err
	}
	s.mu.Lock()
	s.status.Connected, s.status.LastError = true, ""
	s.status.Sessions++
	// The first attempt's outcome is known now, not when the session ends: ClaimPath waits
	// for it, and a Prepare must not wait out the timer on every call of a healthy session.
	s.firstOnce.Do(func() { close(s.firstDone) })
	if s.status.Sessions > 1 {
		s.metrics.Reconnects.Inc()
	}
	s.mu.Unlock()
	s.logger.Info("Connected to the NRI runtime", "socket", s.cfg.Socket, "plugin", s.status.Plugin)

	select {
	case <-closed:
		s.logger.Info("NRI runtime closed the connection; reconnecting", "socket", s.cfg.Socket)
	case <-ctx.Done():
	}
	st.Stop()
	s.mu.Lock()
	if s.status.Synced {
		s.status.LostAt = s.now()
	}
	s.status.Connected, s.status.Synced = false, false
	s.mu.Unlock()
	s.metrics.Connected.Set(0)
	return true, nil
}

// drainLinger is how long Drain waits, after the last hook returned, before it closes the
// connection: the stub writes a hook's answer right after the hook returns, on another
// goroutine, and closing the connection under it would lose that answer.
const drainLinger = 50 * time.Millisecond

// Drain shuts the NRI side down without letting a container through unadjusted: new vGPU
// containers are failed (the kubelet retries them), the requests in flight are answered — at
// most until ctx ends (give it the runtime's request timeout) — and only then is the
// connection closed. It returns once Run has returned; call it before anything the hooks use
// is stopped.
func (s *Supervisor) Drain(ctx context.Context) error {
	err := s.plugin.inflight.drain(ctx)
	if err != nil {
		s.logger.Error(err, "NRI requests still in flight when the drain deadline passed; closing the connection anyway")
	} else {
		select {
		case <-time.After(drainLinger):
		case <-ctx.Done():
		}
	}
	s.mu.Lock()
	stop := s.stop
	s.mu.Unlock()
	if stop == nil {
		return err // Run never ran
	}
	stop()
	<-s.done
	return err
}

// errStartTimeout: the runtime accepted the connection but did not finish configuring the
// plugin in time.
var errStartTimeout = errors.New("NRI registration did not complete in time")

// start runs the stub's Start under a watchdog. On expiry it closes the connection and
// releases the stub: its Start waits, holding the stub's lock, for a Configure that a runtime
// that died mid-registration never sends, and nothing else ends that wait — without release,
// every expiry would leave the stub and two goroutines blocked for the life of the process.
func (s *Supervisor) start(ctx context.Context, st stub.Stub, d *dialer) error {
	errc := make(chan error, 1)
	go func() { errc <- st.Start(ctx) }()
	timer := time.NewTimer(s.cfg.StartTimeout)
	defer timer.Stop()
	var err error
	select {
	case err := <-errc:
		return err
	case <-timer.C:
		err = errStartTimeout
	case <-ctx.Done():
		err = ctx.Err()
	}
	// Closing the connection ends a Start that is still registering; one that waits for
	// Configure needs releasing.
	d.close()
	select {
	case <-errc:
	case <-time.After(startReleaseWait):
		releaseStart(st)
	}
	return err
}

// startReleaseWait is how long start lets a Start end by itself once the connection is closed.
const startReleaseWait = 500 * time.Millisecond

// abandonedKey marks the Configure call with which releaseStart ends a stuck Start.
type abandonedKey struct{}

// releaseStart ends a Start that waits for the runtime's Configure: it delivers one itself,
// marked so that the plugin's Configure fails it, and Start then returns that error, closing
// what it opened and releasing its lock. The stub implements the NRI plugin service (Configure
// among it) to serve the runtime; it is called here directly, once, after the connection to
// the runtime is closed.
func releaseStart(st stub.Stub) {
	c, ok := st.(interface {
		Configure(context.Context, *api.ConfigureRequest) (*api.ConfigureResponse, error)
	})
	if !ok {
		return
	}
	go func() {
		_, _ = c.Configure(context.WithValue(context.Background(), abandonedKey{}, true), &api.ConfigureRequest{})
	}()
}

// synced is the plugin's notice that the current session's Synchronize succeeded.
func (s *Supervisor) synced() {
	s.mu.Lock()
	s.status.Synced, s.status.HadSession, s.status.LostAt = true, true, time.Time{}
	s.mu.Unlock()
	s.metrics.Connected.Set(1)
}

// Status returns the connection's state.
func (s *Supervisor) Status() Status {
	s.mu.Lock()
	st := s.status
	s.mu.Unlock()
	st.Runtime = s.plugin.Runtime()
	return st
}

// LostFor is how long this process has been without a good session since its last one
// ended: 0 while a session is good, and before the first (a runtime that never offered NRI is
// no fault). Check fails once it passes the grace.
func (s *Supervisor) LostFor() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.status
	if !st.HadSession || (st.Connected && st.Synced) || st.LostAt.IsZero() {
		return 0
	}
	return max(s.now().Sub(st.LostAt), 0)
}

// Check is the liveness check (tier 2): after this process has had a good session, being
// without one for longer than the grace period is unhealthy; it clears as soon as a session
// is good again. A runtime that never offered NRI is not a fault: claims take the per-claim
// path, and restarting the plugin would not help.
func (s *Supervisor) Check(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.status
	if !st.HadSession || (st.Connected && st.Synced) {
		return nil
	}
	if down := s.now().Sub(st.LostAt); down > s.cfg.FailureGrace {
		return fmt.Errorf("no NRI session with the runtime on %s for %v (grace %v)", s.cfg.Socket, down.Round(time.Second), s.cfg.FailureGrace)
	}
	return nil
}

// ClaimPath implements the driver's PathSelector: which path a newly prepared claim takes.
//
// The NRI path when this process is connected to the runtime or has had a good session (a
// runtime restart is transient; containers created meanwhile are refused by the runtime's
// required-plugins validation, not given the wrong path). The per-claim path when NRI has
// never been reachable. At start-up the first Prepare can come before the first connection
// attempt has an outcome: it waits for that outcome, at most FirstAttemptWait, rather than
// record the per-claim path forever on a node that has NRI.
func (s *Supervisor) ClaimPath(ctx context.Context) contract.ClaimPath {
	timer := time.NewTimer(s.cfg.FirstAttemptWait)
	defer timer.Stop()
	select {
	case <-s.firstDone:
	case <-timer.C:
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.status.Connected || s.status.HadSession {
		return contract.PathNRI
	}
	return contract.PathPerClaim
}

// dialer connects to the runtime's socket and keeps the connection, so that the watchdog
// can close it.
type dialer struct {
	mu   sync.Mutex
	conn net.Conn
}

func (d *dialer) dial(path string) (net.Conn, error) {
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.conn = c
	d.mu.Unlock()
	return c, nil
}

func (d *dialer) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn != nil {
		_ = d.conn.Close()
	}
}

// nriLogger sends the NRI library's logs to klog, quieter than its own levels: the
// supervisor logs what matters (connected, lost, unreachable) once.
type nriLogger struct{ logger klog.Logger }

func (l nriLogger) Debugf(_ context.Context, format string, args ...any) {
	if v := l.logger.V(6); v.Enabled() {
		v.Info(fmt.Sprintf(format, args...), "source", "nri")
	}
}
func (l nriLogger) Infof(_ context.Context, format string, args ...any) {
	if v := l.logger.V(4); v.Enabled() {
		v.Info(fmt.Sprintf(format, args...), "source", "nri")
	}
}
func (l nriLogger) Warnf(_ context.Context, format string, args ...any) {
	if v := l.logger.V(2); v.Enabled() {
		v.Info(fmt.Sprintf(format, args...), "source", "nri", "level", "warning")
	}
}
func (l nriLogger) Errorf(_ context.Context, format string, args ...any) {
	if v := l.logger.V(2); v.Enabled() {
		v.Info(fmt.Sprintf(format, args...), "source", "nri", "level", "error")
	}
}
