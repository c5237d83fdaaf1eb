package handover

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// Timeouts of the successor's side: generous, the owner's own bounds are tighter.
const (
	fencedTimeout   = 5 * time.Second
	releasedTimeout = 5 * time.Second
	reportTimeout   = 5 * time.Second
)

// Successor is the incoming instance's side of a handover; Client.Request drives it.
type Successor interface {
	// Validate checks, while the owner is fenced, that this instance can take the node over:
	// above all that it reads the checkpoint as the owner left it. An error calls it off.
	Validate() error
	// TakeOver takes the instance lock (the owner has released it) and starts everything the
	// owner runs. On error it must have released the lock again (the old owner takes it back).
	TakeOver(ctx context.Context) (Took, error)
}

// Client is a successor's connection to the owner.
type Client struct {
	c      *conn
	closed chan struct{}
}

// Dial connects to the owner's handover socket.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	return &Client{c: newConn(c), closed: make(chan struct{})}, nil
}

// Close ends the connection.
func (c *Client) Close() {
	select {
	case <-c.closed:
	default:
		close(c.closed)
	}
	_ = c.c.c.Close()
}

// Hello introduces the successor. A refusal is a *RefusedError.
func (c *Client) Hello(h Hello) (Welcome, error) {
	if err := c.c.send(Message{Type: TypeHello, PodUID: h.PodUID}); err != nil {
		return Welcome{}, err
	}
	m, err := c.c.expect(helloTimeout, TypeWelcome, TypeRefuse)
	if err != nil {
		return Welcome{}, err
	}
	if m.Type == TypeRefuse {
		return Welcome{}, &RefusedError{Reason: m.Reason, Retired: m.Retired}
	}
	return Welcome{PodUID: m.PodUID, NRIIndex: m.NRIIndex, NRIConnected: m.NRIConnected}, nil
}

// ErrTookOver wraps the errors after this side took the lock but failed to finish: the caller
// must know that its TakeOver ran.
var ErrTookOver = errors.New("handover failed after the lock changed hands")

// Request asks the owner for the node and, when it agrees, takes it over through s. It returns
// the owner's report once this instance owns the node. Any error before TakeOver ran leaves the
// owner serving; an *AbortError carries the owner's reason.
func (c *Client) Request(ctx context.Context, s Successor) (Report, error) {
	if err := c.c.send(Message{Type: TypeTakeover}); err != nil {
		return Report{}, err
	}
	if _, err := c.c.expect(fencedTimeout, TypeFenced); err != nil {
		return Report{}, err
	}
	if err := s.Validate(); err != nil {
		_ = c.c.send(Message{Type: TypeAbort, Reason: err.Error()})
		return Report{}, err
	}
	if err := c.c.send(Message{Type: TypeCommit}); err != nil {
		return Report{}, err
	}
	if _, err := c.c.expect(releasedTimeout, TypeReleased); err != nil {
		return Report{}, err
	}
	took, err := s.TakeOver(ctx)
	if err != nil {
		_ = c.c.send(Message{Type: TypeAbort, Reason: err.Error()})
		return Report{}, err
	}
	if err := c.c.send(Message{Type: TypeTook, DRASocket: took.DRASocket}); err != nil {
		return Report{}, fmt.Errorf("%w: tell the old owner: %v", ErrTookOver, err)
	}
	m, err := c.c.expect(reportTimeout, TypeReport)
	if err != nil {
		return Report{}, fmt.Errorf("%w: the old owner's report: %v", ErrTookOver, err)
	}
	return Report{Pause: time.Duration(m.PauseNanos), HeldCalls: m.HeldCalls}, nil
}

// Wait blocks until the owner closes the connection (it exited or died) or Close is called.
func (c *Client) Wait() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.c.c.SetReadDeadline(time.Time{})
		_, _ = c.c.r.ReadByte()
	}()
	select {
	case <-done:
	case <-c.closed:
	}
}
