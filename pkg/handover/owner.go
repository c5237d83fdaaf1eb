package handover

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// Timeouts of the owner's side (contract §14). The fence must stay well inside containerd's NRI
// request timeout (2 s): a CreateContainer held past it would be dropped and the container
// created without its adjustment.
const (
	DefaultFenceTimeout  = time.Second
	DefaultCommitTimeout = 2 * time.Second
	DefaultTookTimeout   = 10 * time.Second
	helloTimeout         = 5 * time.Second
)

// Hello is what a successor says about itself.
type Hello struct {
	PodUID string
}

// Welcome is what the owner tells an accepted successor.
type Welcome struct {
	PodUID       string
	NRIIndex     string
	NRIConnected bool
}

// Took is the successor's word that it owns the node.
type Took struct {
	DRASocket string
}

// Report is what the old owner measured (contract §8, handover metrics).
type Report struct {
	Pause     time.Duration
	HeldCalls int64
}

// Owner is the owning instance's side of a handover; Serve drives it.
type Owner interface {
	// Welcome accepts a successor (markers on: it may register with NRI from now on) or refuses
	// it with a *RefusedError.
	Welcome(h Hello) (Welcome, error)
	// Fence holds new calls, waits for those in flight and makes the checkpoint final. On error
	// the handover is called off (Unfence follows).
	Fence(ctx context.Context) error
	// Unfence calls a handover off before the lock changed hands: this instance serves again.
	Unfence()
	// Release stops what only the owner may run and releases the instance lock; from its return
	// this instance is an observer. On error the lock is still held and Unfence follows.
	Release() error
	// Took is told the outcome once the lock is released: took is nil when the successor did
	// not take over (it called off, died or did not answer in time); report is what this side
	// measured.
	Took(took *Took) Report
	// PeerGone is told when the successor's connection ends (markers off).
	PeerGone()
}

// Server serves the handover socket of an owner: one successor at a time.
type Server struct {
	ln     net.Listener
	path   string
	owner  Owner
	logger klog.Logger
	cfg    Timeouts

	mu     sync.Mutex
	active bool
	conns  map[net.Conn]bool
	closed bool
	wg     sync.WaitGroup
}

// Timeouts of Serve; zero values take the defaults.
type Timeouts struct {
	Fence, Commit, Took time.Duration
}

func (t Timeouts) withDefaults() Timeouts {
	if t.Fence <= 0 {
		t.Fence = DefaultFenceTimeout
	}
	if t.Commit <= 0 {
		t.Commit = DefaultCommitTimeout
	}
	if t.Took <= 0 {
		t.Took = DefaultTookTimeout
	}
	return t
}

// Listen binds the handover socket (mode 0600) at path, replacing a stale one: only the holder
// of the instance lock listens, so a file there is a dead owner's.
func Listen(ctx context.Context, path string, owner Owner, t Timeouts) (*Server, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("remove stale handover socket %s: %w", path, err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on handover socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("set mode of handover socket %s: %w", path, err)
	}
	s := &Server{ln: ln, path: path, owner: owner, logger: klog.FromContext(ctx).WithName("handover"), cfg: t.withDefaults(), conns: map[net.Conn]bool{}}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Close stops accepting and removes the socket; a session in progress goes on (it ends with its
// connection). Safe to call twice.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.mu.Unlock()
	if ul, ok := s.ln.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}
	_ = s.ln.Close()
	_ = os.Remove(s.path)
}

// Stop closes the server and every connection, and waits for the sessions to end.
func (s *Server) Stop() {
	s.Close()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		busy := s.active || s.closed
		if !busy {
			s.active = true
		}
		s.conns[c] = true
		s.mu.Unlock()
		// release frees the one successor slot this connection took, once: the session does it
		// before it tells the owner the peer is gone, the connection's end otherwise; a second
		// call never frees the slot a later connection took.
		release := sync.OnceFunc(func() {
			if !busy {
				s.mu.Lock()
				s.active = false
				s.mu.Unlock()
			}
		})
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() {
				release()
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				_ = c.Close()
			}()
			if busy {
				// The successor speaks first: answer its hello, never before it. A refusal sent
				// and the connection closed before the hello arrived made the successor's write
				// of it fail (EPIPE), a transport error instead of the refusal it must learn of.
				cc := newConn(c)
				if _, err := cc.expect(helloTimeout, TypeHello); err != nil {
					return
				}
				_ = cc.send(Message{Type: TypeRefuse, Reason: "another successor is being served"})
				return
			}
			s.session(newConn(c), release)
		}()
	}
}

// session runs one successor's conversation.
func (s *Server) session(c *conn, release func()) {
	hello, err := c.expect(helloTimeout, TypeHello)
	if err != nil {
		s.logger.V(2).Info("Handover connection without a hello", "err", err)
		return
	}
	w, err := s.owner.Welcome(Hello{PodUID: hello.PodUID})
	if err != nil {
		var refused *RefusedError
		m := Message{Type: TypeRefuse, Reason: err.Error()}
		if errors.As(err, &refused) {
			m.Reason, m.Retired = refused.Reason, refused.Retired
		}
		s.logger.Info("Refused a successor", "pod", hello.PodUID, "reason", m.Reason)
		_ = c.send(m)
		return
	}
	defer func() {
		// Free the slot before the owner hears the peer is gone: a successor that dials once
		// told of it must not be refused as busy by a session that has ended.
		release()
		s.owner.PeerGone()
	}()
	if err := c.send(Message{Type: TypeWelcome, PodUID: w.PodUID, NRIIndex: w.NRIIndex, NRIConnected: w.NRIConnected}); err != nil {
		return
	}
	s.logger.Info("A successor announced itself", "pod", hello.PodUID)
	for {
		m, err := c.expect(0, TypeTakeover)
		if err != nil {
			var abort *AbortError
			if errors.As(err, &abort) {
				continue // a successor that changed its mind before asking
			}
			return
		}
		done, err := s.handOver(c, hello.PodUID)
		if err != nil {
			s.logger.Info("Handover called off; this instance keeps serving", "successor", hello.PodUID, "reason", err.Error())
		}
		if done || errors.Is(err, errClosed) {
			// The node changed hands (or the successor died): wait for the connection to end,
			// so that PeerGone tells the plugin when the successor is gone.
			if done {
				_, _ = c.recv(0)
			}
			return
		}
		_ = m
	}
}

// handOver runs one takeover request. done reports whether the lock was released (whatever
// became of the successor after that).
func (s *Server) handOver(c *conn, successor string) (done bool, err error) {
	start := time.Now()
	s.logger.Info("Handing the node over", "successor", successor)
	fctx, cancel := context.WithTimeout(context.Background(), s.cfg.Fence)
	err = s.owner.Fence(fctx)
	cancel()
	if err != nil {
		s.owner.Unfence()
		_ = c.send(Message{Type: TypeAbort, Reason: "fence: " + err.Error()})
		return false, fmt.Errorf("fence: %w", err)
	}
	if err := c.send(Message{Type: TypeFenced}); err != nil {
		s.owner.Unfence()
		return false, errClosed
	}
	if _, err := c.expect(s.cfg.Commit, TypeCommit); err != nil {
		s.owner.Unfence()
		return false, err
	}
	if err := s.owner.Release(); err != nil {
		s.owner.Unfence()
		_ = c.send(Message{Type: TypeAbort, Reason: "release: " + err.Error()})
		return false, fmt.Errorf("release: %w", err)
	}
	s.logger.Info("Released the instance lock to the successor", "successor", successor, "after", time.Since(start))
	if err := c.send(Message{Type: TypeReleased}); err != nil {
		s.owner.Took(nil)
		return true, errClosed
	}
	m, err := c.expect(s.cfg.Took, TypeTook)
	if err != nil {
		s.owner.Took(nil)
		return true, err
	}
	r := s.owner.Took(&Took{DRASocket: m.DRASocket})
	s.logger.Info("The successor owns the node", "successor", successor, "pause", r.Pause, "heldCalls", r.HeldCalls)
	_ = c.send(Message{Type: TypeReport, PauseNanos: int64(r.Pause), HeldCalls: r.HeldCalls})
	return true, nil
}
