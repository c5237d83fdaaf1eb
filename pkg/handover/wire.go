package handover

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// Version is the handover protocol's version (contract §14). A peer that speaks another one is
// treated as one that speaks none: the successor waits for the instance lock.
const Version = 1

// Message types, in the order a handover sends them (contract §14).
const (
	TypeHello    = "hello"    // successor → owner: who it is
	TypeWelcome  = "welcome"  // owner → successor: its NRI index; the successor may prepare
	TypeRefuse   = "refuse"   // owner → successor: not this one (a retired predecessor, busy, stopping)
	TypeTakeover = "takeover" // successor → owner: ready; fence
	TypeFenced   = "fenced"   // owner → successor: calls held, checkpoint final
	TypeCommit   = "commit"   // successor → owner: it reads the checkpoint; release the lock
	TypeAbort    = "abort"    // either way: called off, with the reason
	TypeReleased = "released" // owner → successor: the instance lock is free
	TypeTook     = "took"     // successor → owner: it owns the node; where its DRA socket is
	TypeReport   = "report"   // owner → successor: how long calls were held
)

// maxLine bounds one message.
const maxLine = 64 << 10

// Message is one line of the protocol: a JSON object.
type Message struct {
	Type    string `json:"type"`
	Version int    `json:"version,omitempty"`
	// PodUID: hello, the successor's pod; welcome, the owner's.
	PodUID string `json:"podUID,omitempty"`
	// NRIIndex is the owner's NRI plugin index (welcome); the successor registers after it.
	NRIIndex string `json:"nriIndex,omitempty"`
	// NRIConnected: the owner has an NRI session now (welcome).
	NRIConnected bool `json:"nriConnected,omitempty"`
	// Reason says why (refuse, abort).
	Reason string `json:"reason,omitempty"`
	// Retired: refuse, because the successor's pod handed the node over to this owner.
	Retired bool `json:"retired,omitempty"`
	// DRASocket is the new owner's DRA socket (took): the old one forwards the kubelet's calls
	// it held, or that reach it late, there.
	DRASocket string `json:"draSocket,omitempty"`
	// PauseNanos is how long the old owner held calls, from closing its gates to opening them
	// (report); HeldCalls how many calls waited.
	PauseNanos int64 `json:"pauseNanos,omitempty"`
	HeldCalls  int64 `json:"heldCalls,omitempty"`
}

// conn is one protocol connection.
type conn struct {
	c net.Conn
	r *bufio.Reader
}

func newConn(c net.Conn) *conn { return &conn{c: c, r: bufio.NewReaderSize(c, 4096)} }

func (c *conn) send(m Message) error {
	if m.Version == 0 {
		m.Version = Version
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	_ = c.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err = c.c.Write(append(b, '\n'))
	return err
}

// errClosed: the peer closed the connection (or died).
var errClosed = errors.New("handover peer closed the connection")

// recv reads one message, waiting at most timeout (0: no bound).
func (c *conn) recv(timeout time.Duration) (Message, error) {
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	_ = c.c.SetReadDeadline(deadline)
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) || len(line) > maxLine {
			return Message{}, fmt.Errorf("handover message longer than %d bytes", maxLine)
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return Message{}, fmt.Errorf("no handover message within %v: %w", timeout, err)
		}
		return Message{}, errClosed
	}
	var m Message
	if err := json.Unmarshal(line, &m); err != nil {
		return Message{}, fmt.Errorf("handover message %q: %w", strings.TrimSpace(string(line)), err)
	}
	if m.Version != Version {
		return Message{}, fmt.Errorf("handover protocol version %d, this instance speaks %d", m.Version, Version)
	}
	return m, nil
}

// expect reads one message and checks its type; an abort becomes an *AbortError.
func (c *conn) expect(timeout time.Duration, types ...string) (Message, error) {
	m, err := c.recv(timeout)
	if err != nil {
		return m, err
	}
	if m.Type == TypeAbort {
		return m, &AbortError{Reason: m.Reason}
	}
	for _, t := range types {
		if m.Type == t {
			return m, nil
		}
	}
	return m, fmt.Errorf("handover: got %q, want %s", m.Type, strings.Join(types, " or "))
}

// AbortError is a handover the peer called off, with its reason.
type AbortError struct{ Reason string }

func (e *AbortError) Error() string { return "handover called off by the other instance: " + e.Reason }

// RefusedError is an owner's refusal of a successor.
type RefusedError struct {
	Reason string
	// Retired: the successor's pod handed the node over to this owner; it must not take it back.
	Retired bool
}

func (e *RefusedError) Error() string { return "the owner refuses the handover: " + e.Reason }

// Record is what an owner that speaks the protocol writes into the instance lock file (second
// line, JSON): an instance that finds the lock held learns from it whether to talk to the
// owner or to wait for the lock, and where.
type Record struct {
	Handover int    `json:"handover"`
	PodUID   string `json:"podUID"`
	NRIIndex string `json:"nriIndex,omitempty"`
}

// String is the record's line.
func (r Record) String() string {
	b, _ := json.Marshal(r)
	return string(b)
}

// ParseRecord reads a lock file's record line; ok is false for a holder that wrote none, or
// speaks another protocol version.
func ParseRecord(line string) (Record, bool) {
	var r Record
	if line == "" || json.Unmarshal([]byte(line), &r) != nil || r.Handover != Version {
		return Record{}, false
	}
	return r, true
}
