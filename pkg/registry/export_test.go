package registry

// BlockedLocks is the number of abandoned flock(2) calls still blocked in the kernel.
func BlockedLocks() int {
	blockedLocks.mu.Lock()
	defer blockedLocks.mu.Unlock()
	return len(blockedLocks.m)
}

// RequestsInFlight is the number of whole requests being handled, waiting for their
// pids.config or not: tests wait on it to know that a tenant's requests have reached the
// server before they look at anyone else's.
func RequestsInFlight(s *Server) int {
	s.loads.mu.Lock()
	defer s.loads.mu.Unlock()
	n := 0
	for _, p := range s.loads.pods {
		n += p.n[phaseInFlight]
	}
	return n
}

// NodeRequests is the number of requests that count against the node's MaxRequests: those
// being handled that do not wait for their pids.config.
func NodeRequests(s *Server) int { return len(s.requests) }

// KnownCallers is the number of calling processes whose identity the server keeps.
func KnownCallers(s *Server) int {
	s.identities.mu.Lock()
	defer s.identities.mu.Unlock()
	return len(s.identities.m)
}

// Accepted is the number of connections the server has accepted: tests wait on it to know
// that a flood has reached the server.
func Accepted(s *Server) int { return int(s.accepted.Load()) }

// Reading is the number of connections still reading their frame, all callers.
func Reading(s *Server) int { return int(s.reading.Load()) }
