package registry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// serve runs one connection: identify the caller, read one frame under the header and body
// deadlines, check the bounds, handle the request, answer, close in order. It counts against
// s.reading (and its caller's reading bound) until the frame is complete. A panic anywhere
// becomes INTERNAL, never a crash; a server that stops answers RETRY.
func (s *Server) serve(c *net.UnixConn, reading *atomic.Bool, accepted time.Time) {
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
	req, resp, ok := s.readBounded(c, who, reading, accepted)
	switch {
	case !ok && s.stopping.Load():
		answer(s.restarting(), true)
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

// readBounded reads the frame while the connection counts against the bounds on open
// connections: the global one was taken by dispatch, the caller's is taken here. Over the
// caller's bound the answer is BUSY, without reading.
func (s *Server) readBounded(c *net.UnixConn, who caller, reading *atomic.Bool, accepted time.Time) (Request, *Response, bool) {
	defer s.reading.Add(-1)
	defer reading.Store(false)
	if !s.callers.enter(who.key, phaseReading, s.cfg.MaxOpenConnsPerCaller) {
		r := s.busy("too many open registry connections from this container")
		return Request{}, &r, true
	}
	defer s.callers.leave(who.key, phaseReading)
	return s.readRequest(c, who, accepted)
}

// probeMessage answers Check's probe, an empty request from this very process.
const probeMessage = "registry health probe"

// readRequest reads one frame. It returns (request, nil, true) for a well-formed request,
// (_, INVALID response, true) for a frame that breaks a rule, and ok=false when the peer
// missed a deadline or went away without sending a byte, or the server is stopping.
func (s *Server) readRequest(c *net.UnixConn, who caller, accepted time.Time) (Request, *Response, bool) {
	var hdr [contract.RegistryHeaderLen]byte
	s.setReadDeadline(c, accepted.Add(s.cfg.HeaderTimeout))
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
	s.setReadDeadline(c, time.Now().Add(s.cfg.BodyTimeout))
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

// setReadDeadline sets c's read deadline, or one that has passed when the server is
// stopping: shutdown sets stopping before it interrupts the connections that are reading,
// so one of the two always leaves the deadline passed.
func (s *Server) setReadDeadline(c *net.UnixConn, t time.Time) {
	_ = c.SetReadDeadline(t)
	if s.stopping.Load() {
		_ = c.SetReadDeadline(time.Now())
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

// admit applies the request bounds (the caller's, then the global one) around handle. A
// request over its caller's bound waits for one of its caller's slots, as long as no more than
// MaxOpenConnsPerCaller of them wait and for at most LockTimeout (what one request in flight can
// take waiting for pids.config's lock); then it is BUSY. A server that stops answers it RETRY.
func (s *Server) admit(who caller, req Request) Response {
	wait, cancel := context.WithTimeout(s.ctx, s.cfg.LockTimeout)
	admitted := s.callers.enterInFlight(who.key, s.cfg.MaxRequestsPerCaller, s.cfg.MaxOpenConnsPerCaller, wait.Done())
	cancel()
	switch {
	case !admitted && s.ctx.Err() != nil:
		return s.restarting()
	case !admitted:
		return s.busy("too many registrations in flight from this container")
	}
	defer s.callers.leave(who.key, phaseInFlight)
	select {
	case s.requests <- struct{}{}:
	default:
		return s.busy("too many registrations in flight")
	}
	defer func() { <-s.requests }()
	return s.handleSafely(who, req)
}

// handleSafely is handle with a panic turned into INTERNAL (the bounds above are released
// by their defers either way), and RETRY for work that the server's stop cut short.
func (s *Server) handleSafely(who caller, req Request) (resp Response) {
	defer func() {
		if r := recover(); r != nil {
			s.logger.Error(fmt.Errorf("panic: %v", r), "Registration panicked", "stack", string(debug.Stack()))
			resp = Response{Status: StatusInternal, Message: "internal error in the registry server"}
		}
	}()
	return s.handle(who, req)
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
