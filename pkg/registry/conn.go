package registry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// serve runs one connection: identify the caller, read one frame under the header and body
// deadlines, check the bounds, handle the request, answer, close in order. It counts against
// s.reading (and its caller's and pod's reading bounds) until the frame is complete. A
// connection over MaxOpenConns (overBound) is served only in the place of one shedFor sheds,
// else answered BUSY unread. A panic anywhere becomes INTERNAL, never a crash; a server that
// stops answers RETRY.
func (s *Server) serve(c *net.UnixConn, cs *connState, accepted time.Time, overBound bool) {
	defer s.wg.Done()
	answered := false
	answer := func(resp Response, counted bool) {
		answered = true
		s.respond(c, accepted, resp, counted)
	}
	defer func() {
		if r := recover(); r != nil {
			s.logger.Error(fmt.Errorf("panic: %v", r), "Registry connection panicked", "stack", string(debug.Stack()))
			if !answered {
				answer(Response{Status: StatusInternal, Message: "internal error in the registry server"}, true)
			}
		}
		s.finish(c) // idempotent; respond has already closed an answered connection
	}()

	who := s.identify(c)
	defer who.close()
	if overBound {
		if !s.shedFor(who) {
			cs.reading.Store(false)
			answer(s.busy(tooManyOpen), true)
			s.answering.Add(-1)
			return
		}
		s.answering.Add(-1) // served from here on like any connection within the bound
	}
	req, resp, ok := s.readBounded(c, who, cs, accepted)
	switch {
	case !ok && s.stopping.Load():
		answer(s.restarting(), true)
	case !ok && cs.shed.Load():
		s.deps.Metrics.Shed()
		answer(s.busy(tooManyOpen+"; this connection had not sent its request and its pod holds the most"), true)
	case !ok:
		s.deps.Metrics.Unanswered()
	case resp != nil:
		answer(*resp, resp.Message != probeMessage)
	case s.stopping.Load():
		answer(s.restarting(), true)
	default:
		answer(s.admit(who, req), true)
	}
}

// shedFor makes room over MaxOpenConns for who's connection: it cuts short the read of the
// connection loads.shedFor picks, which is then answered BUSY, and counts who's connection in
// its place (the shed one gives its place back when its read ends). False when there is none
// to shed.
func (s *Server) shedFor(who caller) bool {
	victim := s.loads.shedFor(who)
	if victim == nil {
		return false
	}
	s.reading.Add(1)
	victim.cutShort()
	s.logger.V(4).Info("Shed a registry connection that had not sent its request, for a newcomer", "newcomer", who.key)
	return true
}

// readBounded reads the frame while the connection counts against the bounds on open
// connections: the global one was taken by dispatch (or shedFor), its caller's and pod's are
// taken here. Over those the answer is BUSY, without reading.
func (s *Server) readBounded(c *net.UnixConn, who caller, cs *connState, accepted time.Time) (Request, *Response, bool) {
	defer s.reading.Add(-1)
	defer cs.reading.Store(false)
	over, ok := s.loads.enterReading(who, cs)
	if !ok {
		r := s.busy("too many open registry connections from " + over)
		return Request{}, &r, true
	}
	defer s.loads.leaveReading(who, cs)
	return s.readRequest(c, who, cs, accepted)
}

// probeMessage answers Check's probe, an empty request from this very process.
const probeMessage = "registry health probe"

// readRequest reads one frame. It returns (request, nil, true) for a well-formed request,
// (_, INVALID response, true) for a frame that breaks a rule, and ok=false when the peer
// missed a deadline or went away without sending a byte, or the server is stopping.
func (s *Server) readRequest(c *net.UnixConn, who caller, cs *connState, accepted time.Time) (Request, *Response, bool) {
	var hdr [contract.RegistryHeaderLen]byte
	s.setReadDeadline(cs, accepted.Add(s.cfg.HeaderTimeout))
	if n, err := io.ReadFull(c, hdr[:]); err != nil {
		return s.readFailure(err, n > 0, "header")
	}
	h, err := ParseHeader(hdr[:])
	if err != nil {
		return Request{}, invalidResponse(err), true
	}
	if h.Kind != contract.RegistryKindRequest {
		return Request{}, invalidResponse(invalid("kind %d, want a Register request (%d)", h.Kind, contract.RegistryKindRequest)), true
	}
	body := make([]byte, h.Length)
	s.setReadDeadline(cs, time.Now().Add(s.cfg.BodyTimeout))
	if _, err := io.ReadFull(c, body); err != nil {
		return s.readFailure(err, true, "body")
	}
	// Bytes after the frame are ignored (discarded by the orderly close).
	req, err := ParseRequest(body)
	if err != nil {
		if h.Length == 0 && who.peer.pid == os.Getpid() {
			// Check's probe: answered like any empty request, but not counted.
			return Request{}, &Response{Status: StatusInvalid, Message: probeMessage}, true
		}
		return Request{}, invalidResponse(err), true
	}
	return req, nil, true
}

// setReadDeadline sets the connection's read deadline, or one that has passed when the
// server is stopping or the connection was shed: shutdown sets stopping, and shedFor shed,
// before they cut the connection's read short, so one of the two always leaves the deadline
// passed.
func (s *Server) setReadDeadline(cs *connState, t time.Time) {
	_ = cs.conn.SetReadDeadline(t)
	if s.stopping.Load() || cs.shed.Load() {
		cs.cutShort()
	}
}

// readFailure turns a failed read into the contract's outcome: a missed deadline, or a peer
// gone before its first byte, is closed without an answer; a frame cut short by the peer's
// end of stream is INVALID (the peer may have shut down only its write side, and waits).
func (s *Server) readFailure(err error, started bool, part string) (Request, *Response, bool) {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return Request{}, nil, false
	}
	if started && errors.Is(err, io.ErrUnexpectedEOF) || part == "body" && errors.Is(err, io.EOF) {
		return Request{}, invalidResponse(invalid("frame truncated: end of stream in the %s", part)), true
	}
	return Request{}, nil, false
}

func invalidResponse(err error) *Response {
	return &Response{Status: StatusInvalid, Message: err.Error()}
}

// admit applies the request bounds (the caller's and its pod's, then the global one) around
// handle. A request over its caller's or pod's bound waits for one of their slots, as long as
// no more than MaxOpenConnsPerCaller of the caller's and MaxOpenConnsPerPod of the pod's
// requests wait and for at most LockTimeout (what one request in flight can take waiting for
// pids.config's lock); then it is BUSY. Its global slot is given back as soon as it waits for
// its pids.config (lockWait): a container whose processes hold the lock delays only its own
// registrations and its pod's, never the node's. A server that stops answers it RETRY.
func (s *Server) admit(who caller, req Request) Response {
	wait, cancel := context.WithTimeout(s.ctx, s.cfg.LockTimeout)
	over, admitted := s.loads.enterInFlight(who, wait.Done())
	cancel()
	switch {
	case !admitted && s.ctx.Err() != nil:
		return s.restarting()
	case !admitted:
		return s.busy("too many registrations in flight from " + over)
	}
	defer s.loads.leaveInFlight(who)
	select {
	case s.requests <- struct{}{}:
	default:
		return s.busy("too many registrations in flight on this node")
	}
	lockWait := sync.OnceFunc(func() { <-s.requests })
	defer lockWait()
	return s.handleSafely(who, req, lockWait)
}

// handleSafely is handle with a panic turned into INTERNAL (the bounds above are released
// by their defers either way), and RETRY for work that the server's stop cut short.
func (s *Server) handleSafely(who caller, req Request, lockWait func()) (resp Response) {
	defer func() {
		if r := recover(); r != nil {
			s.logger.Error(fmt.Errorf("panic: %v", r), "Registration panicked", "stack", string(debug.Stack()))
			resp = Response{Status: StatusInternal, Message: "internal error in the registry server"}
		}
	}()
	return s.handle(who, req, lockWait)
}

func (s *Server) busy(msg string) Response {
	return Response{Status: StatusBusy, Message: msg, RetryAfter: s.cfg.RetryAfterBusy, HasRetryAfter: true}
}

// restarting is the answer of a server that stops: the client retries, and reaches the next
// plugin instance (contract §5).
func (s *Server) restarting() Response {
	return s.retry(s.cfg.RetryAfterStopping, "the registry is restarting")
}

// cutShort reports whether err is the server's stop cutting a wait short.
func (s *Server) cutShort(err error) bool {
	return errors.Is(err, context.Canceled) && s.ctx.Err() != nil
}

// respond writes resp, then closes in order (contract §5): shut down the write side and
// discard input for at most Linger, so the client reads its answer rather than a reset.
// Only counted answers go to the metrics.
func (s *Server) respond(c *net.UnixConn, accepted time.Time, resp Response, counted bool) {
	defer s.finish(c)
	_ = c.SetWriteDeadline(time.Now().Add(s.cfg.Linger + time.Second))
	if _, err := c.Write(AppendResponse(nil, resp)); err != nil {
		if counted {
			s.deps.Metrics.Unanswered()
		}
		return
	}
	if counted {
		s.deps.Metrics.Observe(resp.Status.String(), time.Since(accepted))
	}
	_ = c.CloseWrite()
	_ = c.SetReadDeadline(time.Now().Add(s.cfg.Linger))
	var sink [512]byte
	for {
		if _, err := c.Read(sink[:]); err != nil {
			return
		}
	}
}

func (s *Server) finish(c *net.UnixConn) {
	s.untrack(c)
	_ = c.Close()
}
