package registry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// Defaults of Config (contract §5, "Bounds"). The per-caller and per-pod bounds are what keep
// one container, and one pod, from slowing the others. A pod's bounds are four containers'
// each at its own, so that a pod of several containers whose processes all register at once is
// served in turn rather than refused. The node-wide ones only cap the process's descriptors
// and goroutines: 16 pods each at its bound reach them, and then a newcomer takes the place of
// the newest stalled connection of the pod holding the most (shedFor), and requests waiting
// for a pids.config no longer count against MaxRequests.
const (
	DefaultMaxOpenConns          = 4096
	DefaultMaxOpenConnsPerCaller = 64
	DefaultMaxOpenConnsPerPod    = 4 * DefaultMaxOpenConnsPerCaller
	DefaultMaxRequests           = 1024
	DefaultMaxRequestsPerCaller  = 16
	DefaultMaxRequestsPerPod     = 4 * DefaultMaxRequestsPerCaller
	DefaultLockTimeout           = time.Second
	DefaultStopGrace             = time.Second
	DefaultRetryAfterUnsynced    = 100 * time.Millisecond
	DefaultRetryAfterNotStarted  = 50 * time.Millisecond
	DefaultRetryAfterBusy        = 20 * time.Millisecond
	DefaultRetryAfterLocked      = 100 * time.Millisecond
	DefaultRetryAfterStopping    = 200 * time.Millisecond
	DefaultWatchInterval         = time.Second
	DefaultRefreshTimeout        = 500 * time.Millisecond
	DefaultRefreshInterval       = time.Second
	// DefaultHolderTimeout bounds one Claim.VerifyHolder call, DefaultRetryAfterHolderUnknown
	// is the retry_after_ms answered when it could not tell (contract §5).
	DefaultHolderTimeout           = 2 * time.Second
	DefaultRetryAfterHolderUnknown = 200 * time.Millisecond
	// maxBusyAnswers bounds the goroutines that take connections over MaxOpenConns (each
	// serves its connection in the place of one it sheds, or answers it BUSY); past it the
	// accept loop answers them BUSY itself.
	maxBusyAnswers = 256
)

// Config is the registry server's configuration; zero values take the defaults.
type Config struct {
	// Socket is the socket path, claimdir.Layout.RegistrySocket() (contract §5).
	Socket string
	// MaxOpenConnsPerCaller bounds the connections of one caller (one container: its
	// cgroup, see callerKeys) still reading their frame, MaxOpenConnsPerPod those of one pod's
	// callers, MaxOpenConns those of all callers. They also bound the requests waiting for an
	// in-flight slot, per caller and per pod.
	MaxOpenConns          int
	MaxOpenConnsPerCaller int
	MaxOpenConnsPerPod    int
	// MaxRequestsPerCaller bounds one caller's whole requests in flight, MaxRequestsPerPod
	// those of one pod's callers, MaxRequests those of all callers — without the requests
	// waiting for a pids.config (its lock, or another registration's write of it).
	MaxRequests          int
	MaxRequestsPerCaller int
	MaxRequestsPerPod    int
	// LockTimeout bounds the wait for pids.config's lock (a reader in the container holds
	// it); past it the registration is answered RETRY.
	LockTimeout time.Duration
	// StopGrace bounds how long Stop waits for the connections it answers RETRY to close;
	// then it closes what is left and returns.
	StopGrace time.Duration
	// HeaderTimeout, BodyTimeout and Linger default to contract §5's 2 s, 2 s and 100 ms.
	HeaderTimeout time.Duration
	BodyTimeout   time.Duration
	Linger        time.Duration
	// RetryAfter* are the retry_after_ms answered with RETRY before the first Synchronize,
	// RETRY for a created but not started container, BUSY, RETRY for a pids.config that
	// stayed locked, and RETRY from a server that is stopping.
	RetryAfterUnsynced   time.Duration
	RetryAfterNotStarted time.Duration
	RetryAfterBusy       time.Duration
	RetryAfterLocked     time.Duration
	RetryAfterStopping   time.Duration
	// HolderTimeout bounds a claim's VerifyHolder; RetryAfterHolderUnknown is answered with
	// RETRY when it fails to tell.
	HolderTimeout           time.Duration
	RetryAfterHolderUnknown time.Duration
	// WatchInterval is how often the server checks that its socket is still in place.
	WatchInterval time.Duration
	// RefreshTimeout bounds the API read of a claim on a per-claim reservedFor miss (as the
	// NRI hook's); RefreshInterval is the least time between two reads of one claim.
	RefreshTimeout  time.Duration
	RefreshInterval time.Duration
}

func (c *Config) setDefaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.MaxOpenConns, DefaultMaxOpenConns)
	def(&c.MaxOpenConnsPerCaller, DefaultMaxOpenConnsPerCaller)
	def(&c.MaxRequests, DefaultMaxRequests)
	def(&c.MaxRequestsPerCaller, DefaultMaxRequestsPerCaller)
	// A pod's bounds follow its callers' where only those are set.
	def(&c.MaxOpenConnsPerPod, DefaultMaxOpenConnsPerPod/DefaultMaxOpenConnsPerCaller*c.MaxOpenConnsPerCaller)
	def(&c.MaxRequestsPerPod, DefaultMaxRequestsPerPod/DefaultMaxRequestsPerCaller*c.MaxRequestsPerCaller)
	defD(&c.LockTimeout, DefaultLockTimeout)
	defD(&c.StopGrace, DefaultStopGrace)
	defD(&c.HeaderTimeout, contract.RegistryHeaderTimeout)
	defD(&c.BodyTimeout, contract.RegistryBodyTimeout)
	defD(&c.Linger, contract.RegistryLinger)
	defD(&c.RetryAfterUnsynced, DefaultRetryAfterUnsynced)
	defD(&c.RetryAfterNotStarted, DefaultRetryAfterNotStarted)
	defD(&c.RetryAfterBusy, DefaultRetryAfterBusy)
	defD(&c.RetryAfterLocked, DefaultRetryAfterLocked)
	defD(&c.RetryAfterStopping, DefaultRetryAfterStopping)
	defD(&c.WatchInterval, DefaultWatchInterval)
	defD(&c.RefreshTimeout, DefaultRefreshTimeout)
	defD(&c.RefreshInterval, DefaultRefreshInterval)
	defD(&c.HolderTimeout, DefaultHolderTimeout)
	defD(&c.RetryAfterHolderUnknown, DefaultRetryAfterHolderUnknown)
}

// limits are the per-caller and per-pod bounds that loads keeps.
func (c *Config) limits() limits {
	return limits{
		readingPerCaller: c.MaxOpenConnsPerCaller, readingPerPod: c.MaxOpenConnsPerPod,
		inFlightPerCaller: c.MaxRequestsPerCaller, inFlightPerPod: c.MaxRequestsPerPod,
		waitingPerCaller: c.MaxOpenConnsPerCaller, waitingPerPod: c.MaxOpenConnsPerPod,
	}
}

// Deps are what the server asks and writes through.
type Deps struct {
	// Containers resolves NRI-path registrations; nil answers them NOT_FOUND (no NRI path).
	Containers ContainerResolver
	// Claims resolves per-claim registrations; nil answers them NOT_FOUND.
	Claims ClaimResolver
	// Reservations re-reads a claim's reservedFor on a miss; nil: a miss is DENIED.
	Reservations ReservationReader
	// Cgroups is the hierarchy of peer checks and PID lists; nil detects it from /proc.
	Cgroups *CgroupHierarchy
	// Metrics may be nil.
	Metrics *metrics.RegistryMetrics
	// Now is the clock of the reservedFor re-reads' rate; nil is time.Now.
	Now func() time.Time
}

// Server serves the registry socket. Start it with Start; Stop ends it.
type Server struct {
	cfg     Config
	deps    Deps
	cgroups CgroupHierarchy
	logger  logr.Logger
	ctx     context.Context // ends when the server stops: every wait of a handler ends with it
	cancel  context.CancelFunc

	accepted   atomic.Int64 // connections accepted so far: their order (connState.seq)
	reading    atomic.Int64 // connections still reading their frame, all callers
	answering  atomic.Int64 // goroutines taking connections over MaxOpenConns (overBound)
	requests   chan struct{}
	loads      *loads
	identities *identities // known callers, while they live
	claimRegs  *claimRegistrations
	reserved   *reservations // nil without Deps.Reservations
	writes     *writeCoalescer
	registered *registered // the processes answered OK, for the enforcer
	stopping   atomic.Bool // set first thing in shutdown

	mu        sync.Mutex
	current   *listener
	ino       uint64 // inode of our socket at cfg.Socket
	takenOver bool
	conns     map[*net.UnixConn]*connState // open connections
	stopped   bool

	wg           sync.WaitGroup
	shutdownOnce sync.Once
}

// Start binds the registry socket (staged name renamed into place) and serves it until ctx
// ends or Stop is called. It returns once a connect succeeds.
func Start(ctx context.Context, cfg Config, deps Deps) (*Server, error) {
	cfg.setDefaults()
	if cfg.Socket == "" {
		return nil, errors.New("registry: no socket path")
	}
	s := &Server{
		cfg: cfg, deps: deps, logger: klog.FromContext(ctx).WithName("registry"),
		requests: make(chan struct{}, cfg.MaxRequests), loads: newLoads(cfg.limits()), identities: newIdentities(),
		claimRegs: newClaimRegistrations(), writes: newWriteCoalescer(), conns: map[*net.UnixConn]*connState{},
		registered: newRegistered("/proc"),
	}
	if deps.Reservations != nil {
		now := deps.Now
		if now == nil {
			now = time.Now
		}
		s.reserved = newReservations(deps.Reservations, cfg.RefreshTimeout, cfg.RefreshInterval, now)
	}
	if deps.Cgroups != nil {
		s.cgroups = *deps.Cgroups
	} else {
		h, err := DetectCgroupHierarchy("/proc")
		if err != nil {
			return nil, fmt.Errorf("registry: %w", err)
		}
		s.cgroups = h
	}
	ln, ino, err := listenStaged(cfg.Socket)
	if err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	s.ctx, s.cancel = context.WithCancel(ctx)
	s.ino = ino
	s.current = s.serveListener(ln)
	s.wg.Add(1)
	go s.watch()
	context.AfterFunc(s.ctx, func() { s.shutdownOnce.Do(s.shutdown) })
	s.logger.Info("Registry serving", "socket", cfg.Socket, "cgroups", s.cgroups.String())
	return s, nil
}

// OpenConnections is the number of connections the server has accepted and not yet closed.
func (s *Server) OpenConnections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Socket is the path the server serves.
func (s *Server) Socket() string { return s.cfg.Socket }

// Stop stops the server: the socket is removed if it is still this server's (a successor's
// is left alone), no new connection is accepted, and every connection already accepted —
// queued, still reading, or waiting in a handler — is answered RETRY with retry_after_ms
// (contract §5), so a restart loses no registration. It returns once those answers are
// written, or after Config.StopGrace with what is left closed: no handler holds it up.
// Safe to call more than once.
func (s *Server) Stop() {
	s.cancel()
	s.shutdownOnce.Do(s.shutdown)
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	t := time.NewTimer(s.cfg.StopGrace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.logger.Info("Registry stopped before every connection was answered; closed the rest", "connections", s.closeAll())
	}
	s.identities.close()
}

// Yield gives the socket path up to a successor that has moved its own socket there (a
// handover, contract §14): no new connection reaches this server from now on, and what the
// kernel had queued on its socket is accepted and answered as usual, so no registration in
// flight is dropped. The path is never touched again, also not by Stop. Safe to call twice.
func (s *Server) Yield() {
	s.mu.Lock()
	if s.stopped || s.takenOver {
		s.mu.Unlock()
		return
	}
	s.takenOver = true
	l := s.current
	s.mu.Unlock()
	s.logger.Info("Registry socket handed over to the next plugin instance; answering what was queued", "socket", s.cfg.Socket)
	if l != nil {
		s.retire(l)
	}
}

// shutdown runs once, when the server's context ends or Stop is called.
func (s *Server) shutdown() {
	s.stopping.Store(true)
	s.mu.Lock()
	s.stopped = true
	l := s.current
	ours := !s.takenOver && s.ownsSocketLocked()
	s.mu.Unlock()
	if ours {
		// First, so that new connects fail (the client retries them) or reach a successor.
		// Between the inode check and the unlink a successor could rename its socket in;
		// the instance lock (contract §1) keeps a successor from starting meanwhile.
		if err := os.Remove(s.cfg.Socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.logger.Error(err, "Remove registry socket", "socket", s.cfg.Socket)
		}
	}
	if l != nil {
		s.retire(l) // what is queued is accepted and answered RETRY
	}
	// Connections still reading their frame stop reading now and are answered RETRY;
	// handlers waiting for a lock or an API read end with s.ctx.
	s.mu.Lock()
	for _, cs := range s.conns {
		if cs.reading.Load() {
			cs.cutShort()
		}
	}
	s.mu.Unlock()
}

// closeAll closes every open connection and returns how many there were.
func (s *Server) closeAll() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		_ = c.Close()
	}
	return len(s.conns)
}

func (s *Server) ownsSocketLocked() bool {
	ino, err := inodeOf(s.cfg.Socket)
	return err == nil && ino == s.ino
}

// Check is the health check: the socket at the path is this server's and answers a probe
// with a well-formed response. It never counts in the metrics.
func (s *Server) Check(ctx context.Context) error {
	s.mu.Lock()
	owns, taken, stopped := s.ownsSocketLocked(), s.takenOver, s.stopped
	s.mu.Unlock()
	switch {
	case stopped:
		return errors.New("registry server stopped")
	case taken || !owns:
		return fmt.Errorf("registry socket %s is not this server's", s.cfg.Socket)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(time.Second)
	}
	d := net.Dialer{Deadline: deadline}
	c, err := d.DialContext(ctx, "unix", s.cfg.Socket)
	if err != nil {
		return fmt.Errorf("connect to registry socket: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	// A request with an empty body: the server answers INVALID without any lookup.
	if _, err := c.Write(appendHeader(nil, contract.RegistryKindRequest, 0)); err != nil {
		return fmt.Errorf("probe registry socket: %w", err)
	}
	if _, err := readResponse(c); err != nil {
		return fmt.Errorf("probe registry socket: %w", err)
	}
	return nil
}

// readResponse reads one response frame.
func readResponse(r io.Reader) (Response, error) {
	var hdr [contract.RegistryHeaderLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Response{}, fmt.Errorf("read response header: %w", err)
	}
	h, err := ParseHeader(hdr[:])
	if err != nil {
		return Response{}, err
	}
	if h.Kind != contract.RegistryKindResponse {
		return Response{}, invalid("response of kind %d", h.Kind)
	}
	body := make([]byte, h.Length)
	if _, err := io.ReadFull(r, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF // a header with no body is a response cut short
		}
		return Response{}, fmt.Errorf("read response body: %w", err)
	}
	return ParseResponse(body)
}
