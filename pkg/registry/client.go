package registry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"syscall"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// ConnectError is a failed connect: the socket is missing or refuses (the plugin is
// restarting). The client retries it like RETRY.
type ConnectError struct{ Err error }

func (e *ConnectError) Error() string { return "connect to the registry: " + e.Err.Error() }
func (e *ConnectError) Unwrap() error { return e.Err }

// DroppedError is a connection the server closed or reset before a byte of an answer: above
// all a plugin killed with the request accepted. The client retries it like a failed connect.
type DroppedError struct{ Err error }

func (e *DroppedError) Error() string {
	return "the registry closed the connection without a response: " + e.Err.Error()
}
func (e *DroppedError) Unwrap() error { return e.Err }

// Client registers with the registry at Socket, following the client rules of contract §5
// exactly as libvgpu.so does: RETRY, BUSY, failed connects and connections dropped before an
// answer are retried within Budget from the first connect attempt; every other outcome is
// final.
type Client struct {
	Socket string
	// Budget defaults to contract.RegistryClientBudget (30 s).
	Budget time.Duration
	// Timeout bounds one attempt (connect, send, receive); default 5 s.
	Timeout time.Duration
	// Sleep and Jitter are injected by tests; nil uses the clock and math/rand.
	Sleep  func(ctx context.Context, d time.Duration) error
	Jitter func(max time.Duration) time.Duration
}

// Result is the outcome of Register.
type Result struct {
	Response Response
	// Attempts counts connect attempts; ConnectFailures those that failed to connect, and
	// Dropped those closed or reset before a byte of an answer.
	Attempts, ConnectFailures, Dropped int
	// Waits are the waits made between attempts.
	Waits []time.Duration
}

// RetryWait is the wait before the next attempt after resp (nil: a failed connect):
// retry_after_ms, or 100 ms when absent, at least 10 ms; plus up to a quarter more.
func RetryWait(resp *Response, jitter func(max time.Duration) time.Duration) time.Duration {
	base := contract.RegistryClientDefaultWait
	if resp != nil && resp.HasRetryAfter {
		base = resp.RetryAfter
	}
	base = max(base, contract.RegistryClientMinWait)
	extra := base / 4
	if extra <= 0 {
		return base
	}
	return base + min(max(jitter(extra), 0), extra)
}

// Register sends req until a final answer or the budget runs out. The error is nil whenever
// a response came (check Result.Response.Status); it is a *ConnectError or a *DroppedError
// when the budget ran out on those, and another error when an attempt got a malformed,
// cut-short or no answer within its timeout.
func (c *Client) Register(ctx context.Context, req Request) (Result, error) {
	frame, err := AppendRequest(nil, req)
	if err != nil {
		return Result{}, err
	}
	budget := c.Budget
	if budget <= 0 {
		budget = contract.RegistryClientBudget
	}
	sleep, jitter := c.Sleep, c.Jitter
	if sleep == nil {
		sleep = sleepCtx
	}
	if jitter == nil {
		jitter = func(m time.Duration) time.Duration { return rand.N(m + 1) }
	}
	deadline := time.Now().Add(budget)
	var res Result
	for {
		res.Attempts++
		resp, err := c.attempt(ctx, frame)
		var ce *ConnectError
		var de *DroppedError
		var wait time.Duration
		switch {
		case errors.As(err, &ce):
			res.ConnectFailures++
			wait = RetryWait(nil, jitter)
		case errors.As(err, &de):
			res.Dropped++
			wait = RetryWait(nil, jitter)
		case err != nil:
			return res, err
		case resp.Status == StatusRetry || resp.Status == StatusBusy:
			res.Response = resp
			wait = RetryWait(&resp, jitter)
		default:
			res.Response = resp
			return res, nil
		}
		if time.Now().Add(wait).After(deadline) {
			if err != nil {
				return res, err
			}
			return res, nil
		}
		res.Waits = append(res.Waits, wait)
		if err := sleep(ctx, wait); err != nil {
			return res, err
		}
	}
}

// RegisterOnce makes one attempt and returns its response.
func (c *Client) RegisterOnce(ctx context.Context, req Request) (Response, error) {
	frame, err := AppendRequest(nil, req)
	if err != nil {
		return Response{}, err
	}
	return c.attempt(ctx, frame)
}

func (c *Client) attempt(ctx context.Context, frame []byte) (Response, error) {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.Socket)
	if err != nil {
		return Response{}, &ConnectError{Err: err}
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := conn.Write(frame); err != nil {
		err = fmt.Errorf("send registration to %s: %w", c.Socket, err)
		if peerGone(err) {
			return Response{}, &DroppedError{Err: err}
		}
		return Response{}, err
	}
	resp, err := readResponse(conn)
	if err != nil {
		err = fmt.Errorf("registration at %s: %w", c.Socket, err)
		// io.ReadFull says io.EOF only when not a byte came: a frame cut short is
		// io.ErrUnexpectedEOF, and final.
		if errors.Is(err, io.EOF) || peerGone(err) {
			return Response{}, &DroppedError{Err: err}
		}
		return Response{}, err
	}
	return resp, nil
}

// peerGone reports whether err is the server closing or resetting the connection.
func peerGone(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
