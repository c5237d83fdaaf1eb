package registry

// BlockedLocks is the number of abandoned flock(2) calls still blocked in the kernel.
func BlockedLocks() int {
	blockedLocks.mu.Lock()
	defer blockedLocks.mu.Unlock()
	return len(blockedLocks.m)
}

// RequestsInFlight is the number of whole requests being handled: tests wait on it to know
// that a tenant's requests have reached the server before they look at anyone else's.
func RequestsInFlight(s *Server) int { return len(s.requests) }

// KnownCallers is the number of calling processes whose identity the server keeps.
func KnownCallers(s *Server) int {
	s.identities.mu.Lock()
	defer s.identities.mu.Unlock()
	return len(s.identities.m)
}
