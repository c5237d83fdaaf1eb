package nri

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// A vGPU container can run without the adjustment this plugin would have given it: when the
// plugin dies (a SIGKILL, an OOM kill) or overruns the runtime's timeout during its
// CreateContainer, containerd 2.4.2 (NRI 0.12.3 ignores the FailRequest policy) drops the plugin
// and creates the container anyway, and the required-plugins validator lets it pass because the
// plugin was registered when the request began. The library in it refuses CUDA, and it would
// stay so — a pod that runs and cannot use its GPU — until someone deletes the pod (issue 16: the
// chaos suite's plugin kills showed one). So every Synchronize (each reconnection follows such a
// drop) finds these strays and stops them: the kubelet creates them again, with their
// directories (contract §4, "When the plugin does not answer").

// stray is a running vGPU container the runtime created without the plugin's adjustment.
type stray struct {
	containerID, name string
	pod               *api.PodSandbox
	pid               int
	claim             Claim
}

// strayOf returns the container as a stray when it is one: running, its env names (once) a
// claim prepared on this node on the NRI path, its CDI devices — which only the kubelet sets,
// from the claims it prepared for the pod — hold that claim's common device, and it has no
// config mount of ours. Reservation is checked later (it may need an API read).
func (p *Plugin) strayOf(pod *api.PodSandbox, ctr *api.Container) (stray, bool) {
	if pod == nil || ctr.GetPid() == 0 || (ctr.GetState() != api.ContainerState_CONTAINER_RUNNING && ctr.GetState() != api.ContainerState_CONTAINER_PAUSED) {
		return stray{}, false
	}
	env := parseEnv(ctr.GetEnv())
	if env.claimUID == "" || env.conflicting {
		return stray{}, false
	}
	claim, ok := p.claimSource().Prepared(env.claimUID)
	if !ok || !claim.Completed || claim.Path != contract.PathNRI || !slices.Contains(cdiDevices(ctr), claim.CommonCDIDevice) {
		return stray{}, false
	}
	if slices.ContainsFunc(ctr.GetMounts(), func(m *api.Mount) bool { return m.GetDestination() == contract.ContainerConfigDir }) {
		return stray{}, false
	}
	return stray{containerID: ctr.GetId(), name: ctr.GetName(), pod: pod, pid: int(ctr.GetPid()), claim: claim}, true
}

// stopStrays stops each stray whose pod the claim is reserved for (the recorded list, else one
// API read as in CreateContainer: a pod the claim is not reserved for would have been rejected,
// not adjusted, and stopping it would only start it again the same way). It runs after
// Synchronize has answered.
func (p *Plugin) stopStrays(strays []stray) {
	for _, s := range strays {
		logger := p.logger.WithValues("pod", klog.KRef(s.pod.GetNamespace(), s.pod.GetName()), "container", s.name, "id", s.containerID, "claim", claimRef(s.claim))
		if err := p.checkReserved(context.Background(), s.claim, s.pod.GetUid()); err != nil {
			p.metrics.Failures.WithLabelValues(metrics.HookSynchronize).Inc()
			logger.Error(err, "A vGPU container runs without its vGPU directories; not stopping it, its pod's reservation is not confirmed")
			continue
		}
		if err := p.cfg.StopProcess(s.pid, s.containerID); err != nil {
			p.metrics.Failures.WithLabelValues(metrics.HookSynchronize).Inc()
			logger.Error(err, "A vGPU container runs without its vGPU directories; stopping it failed")
			continue
		}
		p.metrics.Stops.Inc()
		logger.Info("Stopped a vGPU container that the runtime created without its vGPU directories (the plugin did not answer its CreateContainer); the kubelet creates it again", "pid", s.pid)
	}
}

// StopContainerProcess SIGKILLs a container's init process, given its host PID and container
// ID: the process is pinned with a pidfd and must be in a cgroup named after the container (the
// cgroupfs driver's <container ID>, systemd's cri-containerd-<container ID>.scope), so a PID
// reused since the runtime replayed it is never signalled.
func StopContainerProcess(procRoot string, pid int, containerID string) error {
	if pid <= 0 || containerID == "" {
		return errors.New("no PID or container ID")
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("open process %d: %w", pid, err)
	}
	defer unix.Close(fd)
	cg, err := readCgroup(procRoot, pid)
	if err != nil {
		return err
	}
	if !strings.Contains(cg.Unified, containerID) && !strings.Contains(cg.PIDsV1, containerID) {
		return fmt.Errorf("process %d is not in container %s's cgroup (%q, %q)", pid, containerID, cg.PIDsV1, cg.Unified)
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
		return fmt.Errorf("SIGKILL process %d: %w", pid, err)
	}
	return nil
}
