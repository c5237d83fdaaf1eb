package nri

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// State is where a container instance stands, as far as the plugin has been told.
type State string

const (
	// StateCreated: CreateContainer was answered; the container has not started yet.
	StateCreated State = "created"
	// StateRunning: StartContainer was seen (or Synchronize replayed a running container).
	StateRunning State = "running"
	// StateStopped: the container exited or was stopped; it may still be restarted as a new
	// instance with the same pod and name.
	StateStopped State = "stopped"
)

// Cgroup is a container's cgroup as found in /proc/<pid>/cgroup of its init process: the
// path in the v1 "pids" hierarchy where one is mounted and the path in the unified (v2)
// hierarchy where that line is present. Empty strings mean "not found".
type Cgroup struct {
	PIDsV1  string `json:"pidsV1,omitempty"`
	Unified string `json:"unified,omitempty"`
}

// Instance is what the cache knows of one container instance of a vGPU claim on the NRI path.
type Instance struct {
	ContainerID   string `json:"containerID"`
	PodUID        string `json:"podUID"`
	PodNamespace  string `json:"podNamespace"`
	PodName       string `json:"podName"`
	ContainerName string `json:"containerName"`
	ClaimUID      string `json:"claimUID"`
	// ConfigDir is the container's host config directory (<D>/config), where the registry
	// writes pids.config.
	ConfigDir string `json:"configDir"`
	// PID is the container's init PID (host PID namespace); 0 until StartContainer.
	PID    int    `json:"pid"`
	Cgroup Cgroup `json:"cgroup"`
	State  State  `json:"state"`
	// Results are the claim's result indices the container uses (Claim.Results) that carry
	// limits: no two running containers of different pods or names may share one (contract §3).
	Results []int `json:"results"`
	// AdminResults are the admin-access results the container uses: unlimited, shared freely.
	AdminResults []int `json:"adminResults,omitempty"`
}

// nameKey identifies a container directory's owner: a container name within a pod.
type nameKey struct{ pod, name string }

type entry struct {
	Instance
	seq uint64 // creation order; the newest instance of a name has the highest
}

// Cache holds the vGPU container instances of this node, keyed by container ID, with an
// index (pod UID, container name) → instances in creation order. It is safe for concurrent
// use; readers (the registry server, on every registration) take a read lock only.
type Cache struct {
	mu     sync.RWMutex
	byID   map[string]*entry
	byName map[nameKey][]*entry
	seq    uint64
	synced atomic.Bool
	// generation counts the rebuilds (Synchronize). A CreateContainer that began before the
	// latest rebuild came over a connection the runtime has since dropped: what it would add
	// is not in the runtime's view (see add).
	generation uint64
}

// NewCache returns an empty cache that has not been synchronized.
func NewCache() *Cache {
	return &Cache{byID: map[string]*entry{}, byName: map[nameKey][]*entry{}}
}

// Synced reports whether the cache has been rebuilt by a successful Synchronize in this
// process. Before that a miss may be a container the runtime has not replayed yet.
func (c *Cache) Synced() bool { return c.synced.Load() }

// Lookup returns the newest instance of the container named containerName in the pod.
func (c *Cache) Lookup(podUID, containerName string) (Instance, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	list := c.byName[nameKey{podUID, containerName}]
	if len(list) == 0 {
		return Instance{}, false
	}
	return list[len(list)-1].copy(), true
}

// Get returns the instance with the container ID.
func (c *Cache) Get(containerID string) (Instance, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.byID[containerID]
	if !ok {
		return Instance{}, false
	}
	return e.copy(), true
}

// List returns every instance, ordered by pod UID, container name and creation.
func (c *Cache) List() []Instance {
	c.mu.RLock()
	out := make([]*entry, 0, len(c.byID))
	for _, e := range c.byID {
		out = append(out, e)
	}
	c.mu.RUnlock()
	slices.SortFunc(out, func(a, b *entry) int {
		return cmp.Or(cmp.Compare(a.PodUID, b.PodUID), cmp.Compare(a.ContainerName, b.ContainerName), cmp.Compare(a.seq, b.seq))
	})
	list := make([]Instance, len(out))
	c.mu.RLock()
	for i, e := range out {
		list[i] = e.copy()
	}
	c.mu.RUnlock()
	return list
}

// Len is the number of instances.
func (c *Cache) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.byID)
}

func (e *entry) copy() Instance {
	in := e.Instance
	in.Results = slices.Clone(e.Results)
	in.AdminResults = slices.Clone(e.AdminResults)
	return in
}

// ResultInUseError says that an allocation result is already used by a container of another
// pod or name that has not stopped (contract §3 invariant).
type ResultInUseError struct {
	Result int
	Holder Instance
}

func (e *ResultInUseError) Error() string {
	return fmt.Sprintf("already used by container %q of pod %s/%s (%s), which has not stopped",
		e.Holder.ContainerName, e.Holder.PodNamespace, e.Holder.PodName, e.Holder.PodUID)
}

// ErrStaleSession says that a CreateContainer began on a connection that a newer Synchronize
// has replaced: the runtime dropped that request (and, under NRI's fail-open, created or failed
// the container without us), so its entry would be a stale one that blocks the container's
// results for others until the next reconnection.
var ErrStaleSession = errors.New("the NRI connection this request came on was replaced by a newer session")

// Generation is the number of rebuilds so far; CreateContainer takes it on entry and hands it
// to add.
func (c *Cache) Generation() uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.generation
}

// add records a new instance unless one of its results is used by an instance of another
// pod or name that has not stopped, or the cache was rebuilt since generation (ErrStaleSession);
// the checks and the insert are one step. Admin-access results (AdminResults) are not checked:
// they carry no limit and no ledger, so any number of containers may use one.
func (c *Cache) add(in Instance, generation uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if generation != c.generation {
		return ErrStaleSession
	}
	for _, e := range c.byID {
		if e.State == StateStopped || e.ClaimUID != in.ClaimUID || (e.PodUID == in.PodUID && e.ContainerName == in.ContainerName) {
			continue
		}
		for _, r := range in.Results {
			if slices.Contains(e.Results, r) {
				return &ResultInUseError{Result: r, Holder: e.copy()}
			}
		}
	}
	c.insertLocked(in)
	return nil
}

func (c *Cache) insertLocked(in Instance) {
	if old, ok := c.byID[in.ContainerID]; ok {
		c.deleteLocked(old)
	}
	c.seq++
	e := &entry{Instance: in, seq: c.seq}
	c.byID[in.ContainerID] = e
	k := nameKey{in.PodUID, in.ContainerName}
	c.byName[k] = append(c.byName[k], e)
}

func (c *Cache) deleteLocked(e *entry) {
	delete(c.byID, e.ContainerID)
	k := nameKey{e.PodUID, e.ContainerName}
	list := slices.DeleteFunc(c.byName[k], func(x *entry) bool { return x == e })
	if len(list) == 0 {
		delete(c.byName, k)
	} else {
		c.byName[k] = list
	}
}

// update applies fn to the instance with the container ID; false when there is none.
func (c *Cache) update(containerID string, fn func(*Instance)) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.byID[containerID]
	if ok {
		fn(&e.Instance)
	}
	return ok
}

// remove drops the instance with the container ID — never another instance of the same pod
// and name. last says that no instance of that pod and name remains.
func (c *Cache) remove(containerID string) (removed Instance, last, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.byID[containerID]
	if !ok {
		return Instance{}, false, false
	}
	c.deleteLocked(e)
	_, remains := c.byName[nameKey{e.PodUID, e.ContainerName}]
	return e.Instance, !remains, true
}

// stopPod marks every instance of the pod stopped and returns them.
func (c *Cache) stopPod(podUID string) []Instance {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Instance
	for _, e := range c.byID {
		if e.PodUID == podUID {
			e.State = StateStopped
			out = append(out, e.copy())
		}
	}
	return out
}

// learn inserts an instance the cache does not hold yet, without the checks of add: the
// previous owner already decided the container (Plugin.learn). false when the ID is known.
func (c *Cache) learn(in Instance) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.byID[in.ContainerID]; ok {
		return false
	}
	c.insertLocked(in)
	return true
}

// replace swaps the whole content for instances (in creation order) and, when synced, marks
// the cache synced (it never unmarks it).
func (c *Cache) replace(instances []Instance, synced bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.byID = make(map[string]*entry, len(instances))
	c.byName = make(map[nameKey][]*entry, len(instances))
	for _, in := range instances {
		c.insertLocked(in)
	}
	c.generation++
	if synced {
		c.synced.Store(true)
	}
}
