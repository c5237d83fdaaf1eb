package registry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// handle answers one well-formed request, in the order of contract §5: target resolution
// (RETRY / NOT_FOUND) → peer check (DENIED) → pids.config → OK. lockWait is called (maybe
// more than once) when the request starts waiting for its pids.config: for another
// registration's write of it, or for its lock.
func (s *Server) handle(who caller, req Request, lockWait func()) Response {
	var resp Response
	if req.PerClaim() {
		resp = s.registerForClaim(who, req, lockWait)
	} else {
		resp = s.registerContainer(who, req, lockWait)
	}
	if resp.Status == StatusOK {
		s.registered.add(who.peer.pid)
	}
	log := s.logger.V(2)
	if resp.Status == StatusDenied || resp.Status == StatusInternal {
		log = s.logger.V(0)
	}
	// The caller comes last: the library's tests match the line up to the message.
	log.Info("Registration", "status", resp.Status.String(), "pod", req.PodUID, "container", req.ContainerName,
		"registerUUID", req.RegisterUUID, "clientVersion", req.ClientVersion, "message", resp.Message,
		"callerPID", who.peer.pid, "caller", who.key)
	return resp
}

// registerContainer is the NRI path: the newest instance of (pod UID, container name).
func (s *Server) registerContainer(who caller, req Request, lockWait func()) Response {
	if s.deps.Containers == nil {
		return Response{Status: StatusNotFound, Message: "this node registers containers by register UUID only (no NRI path)"}
	}
	// Synced is read before the lookup: a miss seen before the first Synchronize completed
	// may only mean "not rebuilt yet" (a plugin restart must never send a registration to a
	// wrong directory or a final NOT_FOUND).
	synced := s.deps.Containers.Synced()
	ctr, ok := s.deps.Containers.Container(req.PodUID, req.ContainerName)
	if !ok {
		if !synced {
			return s.retry(s.cfg.RetryAfterUnsynced, "the node's container cache is not synchronized with the runtime yet")
		}
		return Response{Status: StatusNotFound, Message: fmt.Sprintf("no vGPU container %q in pod %s on this node", req.ContainerName, req.PodUID)}
	}
	target := ctr.Cgroup
	if target == "" {
		if ctr.InitPID <= 0 {
			return s.retry(s.cfg.RetryAfterNotStarted, "the container is created but not started yet")
		}
		cg, err := s.cgroups.OfPID(ctr.InitPID)
		if err != nil {
			// The init process is gone: the container stopped; a restarted instance will
			// replace it in the cache.
			return s.retry(s.cfg.RetryAfterNotStarted, "the container's init process is gone")
		}
		if cg == "/" {
			// A container is never the hierarchy's root: the init PID was reused by a
			// process outside any container, and everything would be "below" it.
			return Response{Status: StatusDenied, Message: "the container's cgroup is unknown"}
		}
		target = cg
	}
	if who.err != nil {
		return Response{Status: StatusDenied, Message: who.err.Error()}
	}
	if !Within(who.cgroup, target) {
		return Response{Status: StatusDenied, Message: fmt.Sprintf("the caller (pid %d) is not in the container %q of pod %s", who.peer.pid, req.ContainerName, req.PodUID)}
	}
	err := s.writes.do(ctr.ConfigDir+"\x00"+target, who.peer.pid, lockWait, func() ([]int, error) {
		return s.writePIDs(ctr.ConfigDir, lockWait, func() ([]int, error) { return s.cgroups.PIDs(target) })
	})
	if err != nil {
		return s.writeFailed(err, "container", ctr.ID, "claim", ctr.ClaimUID)
	}
	return Response{Status: StatusOK}
}

// registerForClaim is the per-claim path: the claim of the register UUID; the caller's pod
// (from its cgroup) must be one the claim is reserved for; pids.config lists the processes of
// every container registered for the claim. The optional pod_uid and container_name of the
// request play no part: on this path nothing sets them for the container (an image may
// carry stale values), and the cgroup is the authority on the caller's pod.
func (s *Server) registerForClaim(who caller, req Request, lockWait func()) Response {
	if s.deps.Claims == nil {
		return Response{Status: StatusNotFound, Message: "this node has no per-claim registrations"}
	}
	claim, ok := s.deps.Claims.ClaimByRegisterUUID(req.RegisterUUID)
	if !ok {
		return Response{Status: StatusNotFound, Message: "no claim prepared on this node has this register UUID"}
	}
	if who.err != nil {
		return Response{Status: StatusDenied, Message: who.err.Error()}
	}
	pod, container, ok := PodOfCgroup(who.cgroup)
	if !ok {
		return Response{Status: StatusDenied, Message: fmt.Sprintf("the caller (pid %d) is not in a pod's container cgroup", who.peer.pid)}
	}
	if resp, held := s.checkHolder(claim, pod); !held {
		return resp
	}
	if !s.claimRegs.known(claim.UID) {
		for _, cg := range s.survivors(claim, pod) {
			s.claimRegs.add(claim.UID, req.RegisterUUID, cg)
		}
	}
	s.claimRegs.add(claim.UID, req.RegisterUUID, container)
	err := s.writes.do(claim.ConfigDir, who.peer.pid, lockWait, func() ([]int, error) {
		return s.writePIDs(claim.ConfigDir, lockWait, func() ([]int, error) { return s.claimRegs.pids(claim.UID, s.cgroups) })
	})
	if err != nil {
		return s.writeFailed(err, "claim", claim.UID)
	}
	return Response{Status: StatusOK}
}

// checkHolder decides whether the caller's pod may register for the claim: through the
// claim's own VerifyHolder where it has one (the device plugin's shares, bounded by
// HolderTimeout), else its recorded reservedFor and, on a miss, the API server's.
func (s *Server) checkHolder(claim Claim, pod string) (Response, bool) {
	if claim.VerifyHolder == nil {
		if slices.Contains(claim.ReservedFor, pod) {
			return Response{}, true
		}
		return s.checkReservation(claim.UID, pod)
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.HolderTimeout)
	defer cancel()
	err := claim.VerifyHolder(ctx, pod)
	switch {
	case err == nil:
		return Response{}, true
	case errors.Is(err, ErrNotHolder):
		return Response{Status: StatusDenied, Message: err.Error()}, false
	case s.cutShort(err):
		return s.restarting(), false
	default:
		s.logger.Error(err, "Cannot tell whether the caller's pod holds the claim", "claim", claim.UID, "pod", pod)
		return s.retry(s.cfg.RetryAfterHolderUnknown, "cannot tell now whether the caller's pod holds the claim: "+err.Error()), false
	}
}

// checkReservation asks the API server whether the claim is reserved for pod, which its
// recorded reservedFor does not list (contract §5); ok when it is. The answer is recorded in
// the checkpoint by the reader, so the pod's next registration does not ask again.
func (s *Server) checkReservation(claimUID, pod string) (resp Response, ok bool) {
	denied := Response{Status: StatusDenied, Message: fmt.Sprintf("the claim is not reserved for the caller's pod %s", pod)}
	if s.reserved == nil {
		return denied, false
	}
	reserved, wait, err := s.reserved.check(s.ctx, claimUID, pod)
	switch {
	case s.cutShort(err):
		return s.restarting(), false
	case err != nil:
		s.logger.Error(err, "Reading the claim's reservedFor from the API server failed", "claim", claimUID, "pod", pod)
		return s.retry(s.cfg.RefreshInterval, "the claim could not be read from the API server"), false
	case reserved:
		return Response{}, true
	case wait > 0:
		return s.retry(wait, "the claim was read from the API server a moment ago; it is read again shortly"), false
	}
	return denied, false
}

// writePIDs writes pids.config, waiting for its lock at most LockTimeout and not past the
// server's stop (lockWait is called when it starts to wait), and returns the PIDs it wrote.
func (s *Server) writePIDs(configDir string, lockWait func(), list func() ([]int, error)) ([]int, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.LockTimeout)
	defer cancel()
	var listed []int
	err := writePIDsConfig(ctx, configDir, lockWait, func() ([]int, error) {
		var err error
		listed, err = list()
		return listed, err
	})
	return listed, err
}

// writeFailed answers a failed pids.config write: RETRY when a process of the container held
// its lock past the deadline (the container's own doing: it slows only itself) or the server
// is stopping, INTERNAL otherwise.
func (s *Server) writeFailed(err error, logKV ...any) Response {
	switch {
	case errors.Is(err, ErrLocked):
		return s.retry(s.cfg.RetryAfterLocked, "pids.config stays locked by a process that reads it")
	case s.cutShort(err):
		return s.restarting()
	}
	s.logger.Error(err, "Write pids.config", logKV...)
	return Response{Status: StatusInternal, Message: "writing pids.config failed"}
}

func (s *Server) retry(after time.Duration, msg string) Response {
	return Response{Status: StatusRetry, Message: msg, RetryAfter: after, HasRetryAfter: true}
}
