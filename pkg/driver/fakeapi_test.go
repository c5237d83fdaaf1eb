package driver

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	resourceac "k8s.io/client-go/applyconfigurations/resource/v1"
)

// fakeClaimAPI is an in-memory API server for claims: Get answers from claims (after failing
// with the queued getErrs, one per call), ApplyStatus records what was applied (after failing
// with the queued errors, one per call).
type fakeClaimAPI struct {
	mu       sync.Mutex
	claims   map[string]*resourceapi.ResourceClaim // by namespace/name
	getErr   error
	getErrs  []error // returned first, one per Get call
	gets     int
	applyErr []error
	applied  []*resourceac.ResourceClaimApplyConfiguration
	calls    int
	onApply  func()        // when set, called at the start of every ApplyStatus call
	changed  chan struct{} // closed and replaced on every ApplyStatus call
}

func newFakeClaimAPI(claims ...*resourceapi.ResourceClaim) *fakeClaimAPI {
	f := &fakeClaimAPI{claims: map[string]*resourceapi.ResourceClaim{}, changed: make(chan struct{})}
	for _, c := range claims {
		f.claims[c.Namespace+"/"+c.Name] = c
	}
	return f
}

func (f *fakeClaimAPI) Get(_ context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gets++
	if len(f.getErrs) > 0 {
		err := f.getErrs[0]
		f.getErrs = f.getErrs[1:]
		return nil, err
	}
	if f.getErr != nil {
		return nil, f.getErr
	}
	c, ok := f.claims[namespace+"/"+name]
	if !ok {
		return nil, apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, name)
	}
	return c.DeepCopy(), nil
}

func (f *fakeClaimAPI) ApplyStatus(_ context.Context, claim *resourceac.ResourceClaimApplyConfiguration) error {
	if f.onApply != nil {
		f.onApply()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	close(f.changed)
	f.changed = make(chan struct{})
	if len(f.applyErr) > 0 {
		err := f.applyErr[0]
		f.applyErr = f.applyErr[1:]
		return err
	}
	f.applied = append(f.applied, claim)
	return nil
}

// waitApplied waits until n applies succeeded and returns them.
func (f *fakeClaimAPI) waitApplied(t *testing.T, n int) []*resourceac.ResourceClaimApplyConfiguration {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		f.mu.Lock()
		applied, changed := append([]*resourceac.ResourceClaimApplyConfiguration(nil), f.applied...), f.changed
		f.mu.Unlock()
		if len(applied) >= n {
			return applied
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("%d device status writes, want %d", len(applied), n)
		}
	}
}

// deviceData decodes the data of one status entry.
func deviceData(t *testing.T, d resourceac.AllocatedDeviceStatusApplyConfiguration) map[string]any {
	t.Helper()
	var out map[string]any
	if d.Data == nil || json.Unmarshal(d.Data.Raw, &out) != nil {
		t.Fatalf("status entry %s has no JSON data", *d.Device)
	}
	return out
}
