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

// Defaults of Config.
const (
	DefaultMaxOpenConns         = 1024
	DefaultMaxRequests          = 256
	DefaultMaxRequestsPerPod    = 32
	DefaultRetryAfterUnsynced   = 100 * time.Millisecond
	DefaultRetryAfterNotStarted = 50 * time.Millisecond
	DefaultRetryAfterBusy       = 20 * time.Millisecond
	DefaultWatchInterval        = time.Second
	// DefaultHolderTimeout bounds one Claim.VerifyHolder call, DefaultRetryAfterHolderUnknown
	// is the retry_after_ms answered when it could not tell (contract §5).
	DefaultHolderTimeout           = 2 * time.Second
	DefaultRetryAfterHolderUnknown = 200 * time.Millisecond
	// maxBusyAnswers bounds the goroutines that answer BUSY to connections over
	// MaxOpenConns; past it such connections are closed at once.
	maxBusyAnswers = 256
)

// Config is the registry server's configuration; zero values take the defaults.
type Config struct {
	// Socket is the socket path, claimdir.Layout.RegistrySocket() (contract §5).
	Socket string
	// MaxOpenConns bounds connections still reading their frame (contract §5: 1,024).
	MaxOpenConns int
	// MaxRequests bounds whole requests in flight, MaxRequestsPerPod those of one pod
	// (by the pod UID the request names, else by its register UUID).
	MaxRequests       int
	MaxRequestsPerPod int
	// HeaderTimeout, BodyTimeout and Linger default to contract §5's 2 s, 2 s and 100 ms.
	HeaderTimeout time.Duration
	BodyTimeout   time.Duration
	Linger        time.Duration
	// RetryAfter* are the retry_after_ms answered with RETRY before the first Synchronize,
	// RETRY for a created but not started container, and BUSY.
	RetryAfterUnsynced   time.Duration
	RetryAfterNotStarted time.Duration
	RetryAfterBusy       time.Duration
	// HolderTimeout bounds a claim's VerifyHolder; RetryAfterHolderUnknown is answered with
	// RETRY when it fails to tell.
	HolderTimeout           time.Duration
	RetryAfterHolderUnknown time.Duration
	// WatchInterval is how often the server checks that its socket is still in place.
	WatchInterval time.Duration
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
	def(&c.MaxRequests, DefaultMaxRequests)
	def(&c.MaxRequestsPerPod, DefaultMaxRequestsPerPod)
	defD(&c.HeaderTimeout, contract.RegistryHeaderTimeout)
	defD(&c.BodyTimeout, contract.RegistryBodyTimeout)
	defD(&c.Linger, contract.RegistryLinger)
	defD(&c.RetryAfterUnsynced, DefaultRetryAfterUnsynced)
	defD(&c.RetryAfterNotStarted, DefaultRetryAfterNotStarted)
	defD(&c.RetryAfterBusy, DefaultRetryAfterBusy)
	defD(&c.WatchInterval, DefaultWatchInterval)
	defD(&c.HolderTimeout, DefaultHolderTimeout)
	defD(&c.RetryAfterHolderUnknown, DefaultRetryAfterHolderUnknown)
}

// Deps are what the server asks and writes through.
type Deps struct {
	// Containers resolves NRI-path registrations; nil answers them NOT_FOUND (no NRI path).
	Containers ContainerResolver
	// Claims resolves per-claim registrations; nil answers them NOT_FOUND.
	Claims ClaimResolver
	// Cgroups is the hierarchy of peer checks and PID lists; nil detects it from /proc.
	Cgroups *CgroupHierarchy
	// Metrics may be nil.
	Metrics *metrics.RegistryMetrics
}

// Server serves the registry socket. Start it with Start; Stop ends it.
type Server struct {
	cfg     Config
	deps    Deps
	cgroups CgroupHierarchy
	logger  logr.Logger
	ctx     context.Context
	cancel  context.CancelFunc

	reading   atomic.Int64 // connections still reading their frame
	answering atomic.Int64 // BUSY answers to connections over MaxOpenConns
	requests  chan struct{}
	podMu     sync.Mutex
	perPod    map[string]int
	claimRegs *claimRegistrations
	writes    *writeCoalescer

	mu        sync.Mutex
	ln        *net.UnixListener
	ino       uint64 // inode of our socket at cfg.Socket
	takenOver bool
	conns     map[*net.UnixConn]struct{}
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
		requests: make(chan struct{}, cfg.MaxRequests), perPod: map[string]int{},
		claimRegs: newClaimRegistrations(), writes: newWriteCoalescer(), conns: map[*net.UnixConn]struct{}{},
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
	s.ln, s.ino = ln, ino
	s.wg.Add(2)
	go s.acceptLoop(ln)
	go s.watch()
	context.AfterFunc(s.ctx, func() { s.shutdownOnce.Do(s.shutdown) })
	s.logger.Info("Registry serving", "socket", cfg.Socket, "cgroups", s.cgroups.String())
	return s, nil
}

// Socket is the path the server serves.
func (s *Server) Socket() string { return s.cfg.Socket }

// Stop closes the listener and every open connection, waits for the server's goroutines,
// and removes the socket only if it is still this server's (a successor's is left alone).
// Safe to call more than once.
func (s *Server) Stop() {
	s.cancel()
	s.shutdownOnce.Do(s.shutdown)
	s.wg.Wait()
}

// shutdown runs once, when the server's context ends or Stop is called.
func (s *Server) shutdown() {
	s.mu.Lock()
	s.stopped = true
	if s.ln != nil {
		_ = s.ln.Close()
	}
	for c := range s.conns {
		_ = c.Close()
	}
	ours := !s.takenOver && s.ownsSocketLocked()
	s.mu.Unlock()
	if ours {
		// Between the inode check and the unlink a successor could rename its socket in;
		// the instance lock (contract §1) keeps a successor from starting meanwhile.
		if err := os.Remove(s.cfg.Socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.logger.Error(err, "Remove registry socket", "socket", s.cfg.Socket)
		}
	}
}

func (s *Server) ownsSocketLocked() bool {
	ino, err := inodeOf(s.cfg.Socket)
	return err == nil && ino == s.ino
}

// acceptLoop hands every connection to its own goroutine and never waits on a client.
func (s *Server) acceptLoop(ln *net.UnixListener) {
	defer s.wg.Done()
	var backoff time.Duration
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || s.ctx.Err() != nil {
				return
			}
			// EMFILE and friends: back off a little and keep serving (as net/http does).
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.logger.Error(err, "Accept on the registry socket", "retryIn", backoff)
			select {
			case <-time.After(backoff):
			case <-s.ctx.Done():
				return
			}
			continue
		}
		backoff = 0
		if !s.track(c) {
			_ = c.Close()
			return
		}
		if s.reading.Add(1) > int64(s.cfg.MaxOpenConns) {
			s.reading.Add(-1)
			s.refuseOpen(c)
			continue
		}
		s.wg.Add(1)
		go s.serve(c, time.Now())
	}
}

// refuseOpen answers BUSY to a connection over MaxOpenConns without reading it.
func (s *Server) refuseOpen(c *net.UnixConn) {
	if s.answering.Add(1) > maxBusyAnswers {
		// Even here the client gets BUSY (contract §5), written from the accept loop without
		// a goroutine: a fresh unix socket's buffer takes the small frame at once, and the
		// short deadline bounds the accept loop if it does not. The write side is shut at once
		// but the socket is closed only after the linger, by a timer rather than a goroutine:
		// a client still sending its request must not get EPIPE before it reads the answer.
		s.answering.Add(-1)
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Millisecond))
		_, err := c.Write(AppendResponse(nil, s.busy("too many open registry connections")))
		_ = c.CloseWrite()
		s.untrack(c)
		time.AfterFunc(s.cfg.Linger, func() { _ = c.Close() })
		if err != nil {
			s.deps.Metrics.Unanswered()
		} else {
			s.deps.Metrics.Observe(StatusBusy.String(), 0)
		}
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer s.answering.Add(-1)
		s.respond(c, time.Now(), s.busy("too many open registry connections"), true)
	}()
}

func (s *Server) track(c *net.UnixConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) untrack(c *net.UnixConn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// watch re-creates the socket if it disappears, notices a successor's takeover, and prunes
// per-claim registrations of processes that are gone.
func (s *Server) watch() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.WatchInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.checkSocket()
		s.claimRegs.prune(s.deps.Claims, s.cgroups)
	}
}

func (s *Server) checkSocket() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped || s.takenOver {
		return
	}
	ino, err := inodeOf(s.cfg.Socket)
	switch {
	case err == nil && ino == s.ino:
		return
	case err == nil:
		// A successor renamed its socket into place: it serves new connections now. Stop
		// accepting (nobody can reach the old socket) and never touch the path again.
		s.takenOver = true
		_ = s.ln.Close()
		s.logger.Info("Registry socket taken over by another server; no longer accepting", "socket", s.cfg.Socket)
		return
	case !errors.Is(err, fs.ErrNotExist):
		s.logger.Error(err, "Check registry socket", "socket", s.cfg.Socket)
		return
	}
	ln, ino, err := listenStaged(s.cfg.Socket)
	if err != nil {
		s.logger.Error(err, "Re-create registry socket", "socket", s.cfg.Socket)
		return
	}
	old := s.ln
	s.ln, s.ino = ln, ino
	_ = old.Close()
	s.wg.Add(1)
	go s.acceptLoop(ln)
	s.logger.Info("Registry socket was removed; re-created it", "socket", s.cfg.Socket)
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
		return Response{}, fmt.Errorf("read response body: %w", err)
	}
	return ParseResponse(body)
}
