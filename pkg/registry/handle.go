package registry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"
)

// handle answers one well-formed request, in the order of contract §5: target resolution
// (RETRY / NOT_FOUND) → peer check (DENIED) → pids.config → OK.
func (s *Server) handle(c *net.UnixConn, req Request) Response {
	var resp Response
	if req.PerClaim() {
		resp = s.registerForClaim(c, req)
	} else {
		resp = s.registerContainer(c, req)
	}
	log := s.logger.V(2)
	if resp.Status == StatusDenied || resp.Status == StatusInternal {
		log = s.logger.V(0)
	}
	log.Info("Registration", "status", resp.Status.String(), "pod", req.PodUID, "container", req.ContainerName,
		"registerUUID", req.RegisterUUID, "clientVersion", req.ClientVersion, "message", resp.Message)
	return resp
}

// registerContainer is the NRI path: the newest instance of (pod UID, container name).
func (s *Server) registerContainer(c *net.UnixConn, req Request) Response {
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
	p, caller, err := s.callerCgroup(c)
	if err != nil {
		return Response{Status: StatusDenied, Message: err.Error()}
	}
	defer p.close()
	if !Within(caller, target) {
		return Response{Status: StatusDenied, Message: fmt.Sprintf("the caller (pid %d) is not in the container %q of pod %s", p.pid, req.ContainerName, req.PodUID)}
	}
	err = s.writes.do(ctr.ConfigDir+"\x00"+target, func() error {
		return WritePIDsConfig(ctr.ConfigDir, func() ([]int, error) { return s.cgroups.PIDs(target) })
	})
	if err != nil {
		s.logger.Error(err, "Write pids.config", "container", ctr.ID, "claim", ctr.ClaimUID)
		return Response{Status: StatusInternal, Message: "writing pids.config failed"}
	}
	return Response{Status: StatusOK}
}

// registerForClaim is the per-claim path: the claim of the register UUID; the caller's pod
// (from its cgroup) must be one the claim is reserved for; pids.config lists the processes of
// every container registered for the claim. The optional pod_uid and container_name of the
// request play no part: on this path nothing sets them for the container (an image may
// carry stale values), and the cgroup is the authority on the caller's pod.
func (s *Server) registerForClaim(c *net.UnixConn, req Request) Response {
	if s.deps.Claims == nil {
		return Response{Status: StatusNotFound, Message: "this node has no per-claim registrations"}
	}
	claim, ok := s.deps.Claims.ClaimByRegisterUUID(req.RegisterUUID)
	if !ok {
		return Response{Status: StatusNotFound, Message: "no claim prepared on this node has this register UUID"}
	}
	p, caller, err := s.callerCgroup(c)
	if err != nil {
		return Response{Status: StatusDenied, Message: err.Error()}
	}
	defer p.close()
	pod, container, ok := PodOfCgroup(caller)
	if !ok {
		return Response{Status: StatusDenied, Message: fmt.Sprintf("the caller (pid %d) is not in a pod's container cgroup", p.pid)}
	}
	if resp, held := s.checkHolder(claim, pod); !held {
		return resp
	}
	s.claimRegs.add(claim.UID, req.RegisterUUID, container)
	err = s.writes.do(claim.ConfigDir, func() error {
		return WritePIDsConfig(claim.ConfigDir, func() ([]int, error) { return s.claimRegs.pids(claim.UID, s.cgroups) })
	})
	if err != nil {
		s.logger.Error(err, "Write pids.config", "claim", claim.UID)
		return Response{Status: StatusInternal, Message: "writing pids.config failed"}
	}
	return Response{Status: StatusOK}
}

// checkHolder decides whether the caller's pod may register for the claim: through the
// claim's own VerifyHolder where it has one (bounded by HolderTimeout), else its reservedFor.
func (s *Server) checkHolder(claim Claim, pod string) (Response, bool) {
	if claim.VerifyHolder == nil {
		if slices.Contains(claim.ReservedFor, pod) {
			return Response{}, true
		}
		return Response{Status: StatusDenied, Message: fmt.Sprintf("the claim is not reserved for the caller's pod %s", pod)}, false
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.HolderTimeout)
	defer cancel()
	err := claim.VerifyHolder(ctx, pod)
	switch {
	case err == nil:
		return Response{}, true
	case errors.Is(err, ErrNotHolder):
		return Response{Status: StatusDenied, Message: err.Error()}, false
	default:
		s.logger.Error(err, "Cannot tell whether the caller's pod holds the claim", "claim", claim.UID, "pod", pod)
		return s.retry(s.cfg.RetryAfterHolderUnknown, "cannot tell now whether the caller's pod holds the claim: "+err.Error()), false
	}
}

// callerCgroup is the cgroup of the connection's peer. It fails — and the caller is
// DENIED — whenever anything about the peer is unknown.
func (s *Server) callerCgroup(c *net.UnixConn) (peer, string, error) {
	p, err := peerOf(c)
	if err != nil {
		return peer{}, "", fmt.Errorf("the caller's credentials are unknown: %w", err)
	}
	cg, err := s.cgroups.OfPID(p.pid)
	if err == nil && !p.stillSame() {
		err = errors.New("the caller exited during the check")
	}
	if err != nil {
		p.close()
		return peer{}, "", fmt.Errorf("the caller's cgroup is unknown: %w", err)
	}
	return p, cg, nil
}

func (s *Server) retry(after time.Duration, msg string) Response {
	return Response{Status: StatusRetry, Message: msg, RetryAfter: after, HasRetryAfter: true}
}
