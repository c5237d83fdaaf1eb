package registry

import (
	"errors"
	"fmt"
	"net"
	"sync"

	"golang.org/x/sys/unix"
)

// caller is who is at the other end of a connection, identified once, when the connection
// is accepted, by what the kernel says and not by what the client sends: its PID from
// SO_PEERCRED and that PID's cgroup. Bounds are kept per caller and per pod (callerKeys), and
// the peer check of the request uses the same identity.
type caller struct {
	peer   peer   // the pidfd, where there is one, is held until the connection ends
	cgroup string // empty when err is set
	// err says why the caller could not be identified; its request is DENIED where the
	// peer is checked (contract §5).
	err error
	key string
	pod string // the key of its pod's bounds (callerKeys)
}

// unidentifiedCaller is the one key, as caller and as pod, of every caller whose cgroup could
// not be read (it exited, or its PID is not visible here): they share one set of bounds. A
// legitimate caller is alive and visible, so only callers that will be DENIED anyway land there.
const unidentifiedCaller = "?"

// identify reads the caller's credentials and cgroup. With a pidfd (SO_PEERPIDFD) the cgroup
// read is known to be that very process's: one that exited meanwhile is unidentified, so a
// reused PID cannot charge its connections to another container.
func (s *Server) identify(c *net.UnixConn) caller {
	if pid, err := peerPID(c); err == nil {
		if id, ok := s.identities.lookup(pid); ok {
			return caller{peer: peer{pid: pid, pidfd: -1}, cgroup: id.cgroup, key: id.key, pod: id.pod}
		}
	}
	p, err := peerOf(c)
	if err != nil {
		return caller{peer: peer{pidfd: -1}, err: fmt.Errorf("the caller's credentials are unknown: %w", err), key: unidentifiedCaller, pod: unidentifiedCaller}
	}
	cg, err := s.cgroups.OfPID(p.pid)
	if err == nil && !p.stillSame() {
		err = errors.New("the caller exited during the check")
	}
	if err != nil {
		p.close()
		return caller{peer: peer{pid: p.pid, pidfd: -1}, err: fmt.Errorf("the caller's cgroup is unknown: %w", err), key: unidentifiedCaller, pod: unidentifiedCaller}
	}
	who := caller{peer: p, cgroup: cg}
	who.key, who.pod = callerKeys(cg)
	s.identities.add(p, cg, who.key, who.pod)
	return who
}

func (c caller) close() { c.peer.close() }

// callerKeys are the keys of a cgroup's bounds. The caller is the container the cgroup
// belongs to: for a pod's cgroup, the pod cgroup's child on the way to it (PodOfCgroup), so
// that cgroups a container creates below its own do not count as other callers; otherwise the
// cgroup itself. The pod is the pod's UID; a cgroup outside pods is a pod of its own, keyed by
// its caller key (a cgroup path, never a UID).
func callerKeys(cgroup string) (key, pod string) {
	if uid, container, ok := PodOfCgroup(cgroup); ok {
		return container, uid
	}
	return cgroup, cgroup
}

// identities caches, per calling process while it lives, what identify read: its cgroup and
// key, with a pidfd of that very process (a dup of the one SO_PEERPIDFD gave) that says
// whether it still lives. One process may connect thousands of times a second (a flood that
// reopens what the server closes, or a client retrying); each connection of a known process
// then costs SO_PEERCRED and one pidfd_send_signal instead of SO_PEERPIDFD, a read of
// /proc/<pid>/cgroup and a close: about a third less CPU per flood connection, measured by
// BenchmarkRegistrationUnderTenantFlood (25 instead of 35 µs). A live pidfd rules a reused PID out. It relies on what the
// registry relies on anyway: a process does not move to another container's cgroup while it
// lives (the target's cgroup is recorded once, at StartContainer). Without SO_PEERPIDFD
// nothing is cached.
type identities struct {
	mu     sync.Mutex
	m      map[int]identity // by PID
	closed bool             // the server stopped: nothing is added any more
}

type identity struct {
	pidfd            int
	cgroup, key, pod string
}

// maxIdentities bounds the cache (and the pidfds it holds).
const maxIdentities = 4096

func newIdentities() *identities { return &identities{m: map[int]identity{}} }

// lookup returns pid's entry while its process lives. The liveness check runs under the lock,
// so a pidfd is never used after another caller closed it.
func (ids *identities) lookup(pid int) (identity, bool) {
	ids.mu.Lock()
	defer ids.mu.Unlock()
	id, ok := ids.m[pid]
	if !ok {
		return identity{}, false
	}
	if unix.PidfdSendSignal(id.pidfd, 0, nil, 0) != nil {
		delete(ids.m, pid)
		_ = unix.Close(id.pidfd)
		return identity{}, false
	}
	return id, true
}

// add records p's identity when p carries a pidfd and there is room; the server's watch
// drops the entries of processes that are gone every WatchInterval.
func (ids *identities) add(p peer, cgroup, key, pod string) {
	if p.pidfd < 0 {
		return
	}
	ids.mu.Lock()
	defer ids.mu.Unlock()
	if _, ok := ids.m[p.pid]; ok || ids.closed || len(ids.m) >= maxIdentities {
		return
	}
	fd, err := unix.FcntlInt(uintptr(p.pidfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return
	}
	ids.m[p.pid] = identity{pidfd: fd, cgroup: cgroup, key: key, pod: pod}
}

// prune drops the entries of processes that are gone.
func (ids *identities) prune() {
	ids.mu.Lock()
	defer ids.mu.Unlock()
	for pid, id := range ids.m {
		if unix.PidfdSendSignal(id.pidfd, 0, nil, 0) != nil {
			delete(ids.m, pid)
			_ = unix.Close(id.pidfd)
		}
	}
}

// close closes every pidfd and keeps new ones out (the server stopped).
func (ids *identities) close() {
	ids.mu.Lock()
	defer ids.mu.Unlock()
	ids.closed = true
	for pid, id := range ids.m {
		delete(ids.m, pid)
		_ = unix.Close(id.pidfd)
	}
}
