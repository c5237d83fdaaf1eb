package driver

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// A claim the API server says is no longer in use here (deleted, deallocated, reserved for
// nobody) may still have containers running with its devices: a tenant who strips the claim's
// finalizer and deletes it keeps its pod, and a controller may clear an allocation by mistake.
// Unpreparing it then would free capacity that is still held — the scheduler hands it to another
// tenant, whose Prepare is admitted and who runs out of memory. So the reconciliation keeps such
// a claim prepared (its capacity keeps counting in Prepare's check) for as long as a container
// uses it, counts and logs it, raises one Warning event on each of its pods, and, where the
// operator chose StaleInUseStop, stops those containers first (contract §8).

// StaleInUsePolicy is what the reconciliation does with the containers of a stale claim that
// still run (--stale-claim-containers).
type StaleInUsePolicy string

const (
	// StaleInUseKeep (the default) keeps the claim prepared until its containers stop.
	StaleInUseKeep StaleInUsePolicy = "keep"
	// StaleInUseStop kills the containers' processes, then unprepares the claim: the kubelet's
	// restart of such a container is refused, as the claim is no longer prepared here.
	StaleInUseStop StaleInUsePolicy = "stop"
)

// ParseStaleInUsePolicy parses --stale-claim-containers.
func ParseStaleInUsePolicy(s string) (StaleInUsePolicy, error) {
	switch p := StaleInUsePolicy(s); p {
	case StaleInUseKeep, StaleInUseStop:
		return p, nil
	}
	return "", fmt.Errorf("%q: want keep or stop", s)
}

// ClaimUser is a container of this node that still runs with a claim's devices.
type ClaimUser struct {
	Namespace, Pod, PodUID string
	// Container is empty on the per-claim path, where the claim's containers are known by
	// their cgroups only.
	Container string
	// Cgroups are the container cgroups (the registry's hierarchy) whose processes use it.
	Cgroups []string
}

func (u ClaimUser) String() string {
	switch {
	case u.Pod != "" && u.Container != "":
		return u.Namespace + "/" + u.Pod + "/" + u.Container
	case u.Pod != "":
		return u.Namespace + "/" + u.Pod
	case u.PodUID != "":
		return "pod " + u.PodUID + " " + strings.Join(u.Cgroups, ",")
	}
	return strings.Join(u.Cgroups, ",")
}

// ClaimUsers are the driver's view of the containers that use the claims it prepared.
type ClaimUsers interface {
	// Users lists the containers that run with the claim now. An error means it cannot tell
	// yet (the NRI cache is not rebuilt after a restart): the claim is kept for this pass.
	Users(uid string, c checkpoint.Claim) ([]ClaimUser, error)
	// Stop kills the users' processes and returns once they are gone, or an error.
	Stop(ctx context.Context, users []ClaimUser) error
	// Warn raises a Warning event on the user's pod (none when its name is unknown).
	Warn(u ClaimUser, reason, message string)
}

// EventStaleClaimInUse is the Warning event's reason.
const EventStaleClaimInUse = "VGPUStaleClaimInUse"

// staleInUse remembers the stale claims found in use, with the reason, so that each episode
// is logged, counted and told once.
type staleInUse struct {
	mu     sync.Mutex
	claims map[string]string // UID → stale reason
}

// keepInUse decides a stale claim that has users. It returns true when the claim is to be
// unprepared now (the users were stopped), false when it is kept.
func (d *Driver) keepInUse(ctx context.Context, uid string, c checkpoint.Claim, reason string, users []ClaimUser) (unprepare bool, err error) {
	logger := klog.FromContext(ctx)
	names := make([]string, len(users))
	for i, u := range users {
		names[i] = u.String()
	}
	d.inUse.mu.Lock()
	first := d.inUse.claims[uid] != reason
	d.inUse.claims[uid] = reason
	d.inUse.mu.Unlock()
	if first {
		d.dra.StaleClaimsInUse.WithLabelValues(reason).Inc()
	}
	if d.cfg.StaleInUse != StaleInUseStop {
		if first {
			logger.Info("Keeping a claim prepared that the API server no longer has in use here: its containers still run, and its capacity stays held until they stop",
				"claim", klog.KRef(c.Namespace, c.Name), "uid", uid, "reason", reason, "containers", names)
			msg := fmt.Sprintf("ResourceClaim %s/%s is %s but this container still runs with its vGPU share: the node keeps the share's capacity held until the container stops", c.Namespace, c.Name, describeStale(reason))
			for _, u := range users {
				d.deps.Users.Warn(u, EventStaleClaimInUse, msg)
			}
		}
		return false, nil
	}
	logger.Info("Stopping the containers of a claim that the API server no longer has in use here, then unpreparing it",
		"claim", klog.KRef(c.Namespace, c.Name), "uid", uid, "reason", reason, "containers", names)
	msg := fmt.Sprintf("ResourceClaim %s/%s is %s: the node stops this container, which still ran with its vGPU share (--stale-claim-containers=stop)", c.Namespace, c.Name, describeStale(reason))
	for _, u := range users {
		d.deps.Users.Warn(u, EventStaleClaimInUse, msg)
	}
	if err := d.deps.Users.Stop(ctx, users); err != nil {
		return false, fmt.Errorf("stop the containers of stale claim %s/%s (%s): %w", c.Namespace, c.Name, uid, err)
	}
	d.dra.StaleClaimStops.Add(float64(len(users)))
	return true, nil
}

// isKeptInUse reports whether the claim is one kept for its containers.
func (d *Driver) isKeptInUse(uid string) bool {
	d.inUse.mu.Lock()
	defer d.inUse.mu.Unlock()
	return d.inUse.claims[uid] != ""
}

// forgetInUse drops the claims that are no longer stale and in use from the record; kept
// are those of this pass.
func (d *Driver) forgetInUse(kept map[string]bool) {
	d.inUse.mu.Lock()
	defer d.inUse.mu.Unlock()
	for uid := range d.inUse.claims {
		if !kept[uid] {
			delete(d.inUse.claims, uid)
		}
	}
	d.dra.StaleClaimsHeld.Set(float64(len(d.inUse.claims)))
}

func describeStale(reason string) string {
	switch reason {
	case metrics.ReconcileDeleted:
		return "deleted"
	case metrics.ReconcileDeallocated:
		return "no longer allocated to this node's devices"
	case metrics.ReconcileNotReserved:
		return "reserved for no pod"
	}
	return reason
}
