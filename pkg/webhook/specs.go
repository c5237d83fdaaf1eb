package webhook

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/informers"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// ErrNotFound is returned (wrapped) by Specs for an object that does not exist.
var ErrNotFound = errors.New("not found")

// Specs looks up what the claims a pod references ask for.
type Specs interface {
	// ClaimSpec returns the spec of a ResourceClaim.
	ClaimSpec(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaimSpec, error)
	// TemplateSpec returns the spec that claims made from a ResourceClaimTemplate get.
	TemplateSpec(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaimSpec, error)
}

// CacheSpecs serves Specs from informer caches, never from a read per request. A lookup that
// misses waits, up to a bound, for the object to arrive: `kubectl apply` of one file creates a
// claim milliseconds before the pod that uses it, and the watch may not have delivered it yet.
// At most maxWaits lookups wait at once: a review of a pod whose claim does not exist would
// otherwise hold a goroutine and a connection for the whole wait, and a client that sends many
// could pile them up; a lookup beyond the bound answers at once, as if its wait had ended.
// The returned specs belong to the cache and must not be modified.
type CacheSpecs struct {
	claims    resourcelisters.ResourceClaimLister
	templates resourcelisters.ResourceClaimTemplateLister
	synced    []cache.InformerSynced
	wait      time.Duration
	// waits holds a token for each lookup that is waiting; its capacity is the bound.
	waits chan struct{}
	added broadcast
}

// NewCacheSpecs registers the ResourceClaim and ResourceClaimTemplate informers with factory
// (start the factory afterwards). wait bounds how long a lookup waits for a missing object, and
// maxWaits how many lookups wait at once (at least 1).
func NewCacheSpecs(factory informers.SharedInformerFactory, wait time.Duration, maxWaits int) (*CacheSpecs, error) {
	s := &CacheSpecs{wait: wait, waits: make(chan struct{}, max(maxWaits, 1)), added: broadcast{ch: make(chan struct{})}}
	claims := factory.Resource().V1().ResourceClaims()
	templates := factory.Resource().V1().ResourceClaimTemplates()
	s.claims, s.templates = claims.Lister(), templates.Lister()
	onAdd := cache.ResourceEventHandlerFuncs{AddFunc: func(any) { s.added.notify() }}
	for _, inf := range []cache.SharedIndexInformer{claims.Informer(), templates.Informer()} {
		// The webhook reads only specs: dropping managed fields halves what the cache holds.
		if err := inf.SetTransform(dropManagedFields); err != nil {
			return nil, fmt.Errorf("set the informer's transform: %w", err)
		}
		reg, err := inf.AddEventHandler(onAdd)
		if err != nil {
			return nil, fmt.Errorf("add an informer event handler: %w", err)
		}
		s.synced = append(s.synced, inf.HasSynced, reg.HasSynced)
	}
	return s, nil
}

// Synced reports whether both caches hold everything the API server had when they started.
func (s *CacheSpecs) Synced() bool {
	for _, synced := range s.synced {
		if !synced() {
			return false
		}
	}
	return true
}

// ClaimSpec implements Specs.
func (s *CacheSpecs) ClaimSpec(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaimSpec, error) {
	return waitFor(ctx, s, func() (*resourceapi.ResourceClaimSpec, error) {
		c, err := s.claims.ResourceClaims(namespace).Get(name)
		if err != nil {
			return nil, err
		}
		return &c.Spec, nil
	})
}

// TemplateSpec implements Specs.
func (s *CacheSpecs) TemplateSpec(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaimSpec, error) {
	return waitFor(ctx, s, func() (*resourceapi.ResourceClaimSpec, error) {
		t, err := s.templates.ResourceClaimTemplates(namespace).Get(name)
		if err != nil {
			return nil, err
		}
		return &t.Spec.Spec, nil
	})
}

// waitFor calls get until it finds the object, re-trying each time a cache adds one, until the
// wait bound or ctx ends. With maxWaits lookups already waiting it does not wait.
func waitFor(ctx context.Context, s *CacheSpecs, get func() (*resourceapi.ResourceClaimSpec, error)) (*resourceapi.ResourceClaimSpec, error) {
	var deadline <-chan time.Time
	for {
		added := s.added.wait() // before the lookup, so that an add in between is not missed
		spec, err := get()
		if !apierrors.IsNotFound(err) {
			return spec, err
		}
		if deadline == nil {
			if ctx.Value(noWaitKey{}) != nil {
				return nil, ErrNotFound
			}
			select {
			case s.waits <- struct{}{}:
				defer func() { <-s.waits }()
			default:
				klog.FromContext(ctx).V(2).Info("Not waiting for a missing claim: the most lookups wait already", "maxWaits", cap(s.waits))
				return nil, ErrNotFound
			}
			t := time.NewTimer(s.wait)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-added:
		case <-deadline:
			return nil, ErrNotFound
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the object to reach the cache: %w", context.Cause(ctx))
		}
	}
}

// noWaitKey marks a context whose lookups do not wait for a missing object.
type noWaitKey struct{}

// withoutWait returns ctx with lookups that answer at once: for pods already admitted, whose
// claims are not being created right now.
func withoutWait(ctx context.Context) context.Context {
	return context.WithValue(ctx, noWaitKey{}, true)
}

// broadcast wakes every waiter when a cache adds an object.
type broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

// wait returns a channel that is closed at the next notify.
func (b *broadcast) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ch
}

func (b *broadcast) notify() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.ch)
	b.ch = make(chan struct{})
}

// dropManagedFields is the informers' transform.
func dropManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}
