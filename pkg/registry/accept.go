package registry

import (
	"container/list"
	"errors"
	"io/fs"
	"net"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// listener is one listening socket and its accept loop. A server has one at a time; the
// one it replaces (socket removed and re-created, or taken over by a successor) and the
// last one at shutdown are retired: nothing the kernel queued on it is dropped.
type listener struct {
	ln       *net.UnixListener
	done     chan struct{} // closed when its accept loop has returned
	retiring atomic.Bool
}

func (s *Server) serveListener(ln *net.UnixListener) *listener {
	l := &listener{ln: ln, done: make(chan struct{})}
	s.wg.Add(1)
	go s.acceptLoop(l)
	return l
}

// acceptLoop hands every connection to its own goroutine and never waits on a client.
func (s *Server) acceptLoop(l *listener) {
	defer s.wg.Done()
	defer close(l.done)
	var backoff time.Duration
	for {
		c, err := l.ln.AcceptUnix()
		if err != nil {
			if l.retiring.Load() || errors.Is(err, net.ErrClosed) {
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
		s.dispatch(c)
	}
}

// dispatch starts serving one accepted connection. Over MaxOpenConns connections reading
// their frame it hands the connection to overBound instead, without identifying it here: the
// accept loop never waits on a client or on /proc.
func (s *Server) dispatch(c *net.UnixConn) {
	cs := s.track(c)
	if s.reading.Add(1) > int64(s.cfg.MaxOpenConns) {
		s.reading.Add(-1)
		s.overBound(c, cs)
		return
	}
	s.wg.Add(1)
	go s.serve(c, cs, time.Now(), false)
}

// retire stops l's accept loop, dispatches every connection still queued on it and closes
// it. Closing a listening socket resets the connections queued on it, which a client takes
// as a final answer (contract §5); so first shutdown(SHUT_RD), after which connect(2) is
// refused (a failed connect the client retries) and nothing more can queue, then accept
// what is there. Go's own Accept cannot drain: with an expired deadline it does not try the
// syscall, so the queue is read with accept4(2) on the descriptor.
func (s *Server) retire(l *listener) {
	if l.retiring.Swap(true) {
		return
	}
	if rc, err := l.ln.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), unix.SHUT_RD) })
	}
	_ = l.ln.SetDeadline(time.Unix(1, 0)) // wakes its accept loop, which sees retiring
	<-l.done
	for _, c := range drainQueued(l.ln) {
		s.dispatch(c)
	}
	_ = l.ln.Close()
}

// drainQueued accepts every connection queued on ln, without blocking.
func drainQueued(ln *net.UnixListener) []*net.UnixConn {
	rc, err := ln.SyscallConn()
	if err != nil {
		return nil
	}
	var fds []int
	_ = rc.Control(func(fd uintptr) {
		for {
			nfd, _, err := unix.Accept4(int(fd), unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
			if err == unix.EINTR || err == unix.ECONNABORTED {
				continue
			}
			if err != nil { // EAGAIN: the queue is empty
				return
			}
			fds = append(fds, nfd)
		}
	})
	conns := make([]*net.UnixConn, 0, len(fds))
	for _, fd := range fds {
		f := os.NewFile(uintptr(fd), "registry connection")
		c, err := net.FileConn(f) // dups the descriptor into Go's poller
		_ = f.Close()
		if err != nil {
			continue
		}
		if uc, ok := c.(*net.UnixConn); ok {
			conns = append(conns, uc)
		} else {
			_ = c.Close()
		}
	}
	return conns
}

// overBound takes a connection over MaxOpenConns. One of at most maxBusyAnswers goroutines
// identifies it and serves it in the place of a connection it sheds (serve, shedFor), or
// answers it BUSY without reading it. Past those the accept loop answers BUSY itself, without
// a goroutine: a fresh unix socket's buffer takes the small frame at once, and the short
// deadline bounds the accept loop if it does not. The write side is shut at once but the
// socket is closed only after the linger, by a timer rather than a goroutine: a client still
// sending its request must not get EPIPE before it reads the answer.
func (s *Server) overBound(c *net.UnixConn, cs *connState) {
	if s.answering.Add(1) <= maxBusyAnswers {
		s.wg.Add(1)
		go s.serve(c, cs, time.Now(), true)
		return
	}
	s.answering.Add(-1)
	cs.reading.Store(false)
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Millisecond))
	_, err := c.Write(AppendResponse(nil, s.busy(tooManyOpen)))
	_ = c.CloseWrite()
	s.untrack(c)
	time.AfterFunc(s.cfg.Linger, func() { _ = c.Close() })
	if err != nil {
		s.deps.Metrics.Unanswered()
	} else {
		s.deps.Metrics.Observe(StatusBusy.String(), 0)
	}
}

// tooManyOpen is the BUSY message over MaxOpenConns.
const tooManyOpen = "too many open registry connections on this node"

// connState is what the server keeps of an open connection.
type connState struct {
	conn *net.UnixConn
	seq  uint64 // accept order
	// reading: still reading its frame (shutdown and shedding cut those reads short).
	reading atomic.Bool
	// shed: picked to make room for a newcomer over MaxOpenConns; once its read is cut short
	// it is answered BUSY.
	shed atomic.Bool
	// sheddable is its element in its pod's list of connections reading their frame while it
	// may be shed; guarded by loads.mu.
	sheddable *list.Element
}

// cutShort ends the connection's read now. A read that sets its deadline afterwards checks
// shed and stopping again (setReadDeadline), so one of the two always leaves it passed.
func (cs *connState) cutShort() { _ = cs.conn.SetReadDeadline(time.Now()) }

// track records an open connection.
func (s *Server) track(c *net.UnixConn) *connState {
	cs := &connState{conn: c, seq: uint64(s.accepted.Add(1))}
	cs.reading.Store(true)
	s.mu.Lock()
	s.conns[c] = cs
	s.mu.Unlock()
	return cs
}

func (s *Server) untrack(c *net.UnixConn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// watch re-creates the socket if it disappears, notices a successor's takeover, and prunes
// per-claim registrations of processes that are gone and old reservedFor reads.
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
		if old := s.checkSocket(); old != nil {
			s.retire(old)
		}
		s.claimRegs.prune(s.deps.Claims, s.cgroups)
		s.identities.prune()
		s.registered.prune()
		if s.reserved != nil {
			s.reserved.prune()
		}
	}
}

// checkSocket returns the listener to retire, if any: the old one of a re-created socket,
// or ours once a successor has taken the path over.
func (s *Server) checkSocket() *listener {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped || s.takenOver {
		return nil
	}
	ino, err := inodeOf(s.cfg.Socket)
	switch {
	case err == nil && ino == s.ino:
		return nil
	case err == nil:
		// A successor renamed its socket into place: it serves new connections now. Stop
		// accepting (nobody can reach the old socket) and never touch the path again.
		s.takenOver = true
		s.logger.Info("Registry socket taken over by another server; no longer accepting", "socket", s.cfg.Socket)
		return s.current
	case !errors.Is(err, fs.ErrNotExist):
		s.logger.Error(err, "Check registry socket", "socket", s.cfg.Socket)
		return nil
	}
	ln, ino, err := listenStaged(s.cfg.Socket)
	if err != nil {
		s.logger.Error(err, "Re-create registry socket", "socket", s.cfg.Socket)
		return nil
	}
	old := s.current
	s.current, s.ino = s.serveListener(ln), ino
	s.logger.Info("Registry socket was removed; re-created it", "socket", s.cfg.Socket)
	return old
}
