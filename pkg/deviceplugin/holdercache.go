package deviceplugin

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
)

// Every registration in device-plugin mode asks who holds the share: a pod-resources List of
// the kubelet and a GET of the API server. Unbounded, one container re-registering in a loop
// would exhaust the kubelet's pod-resources rate limit (about 100 QPS, burst 10) for every
// client of the node, and a few would saturate the plugin's API client. holderAnswers bounds it:
//
//   - a "yes" is remembered per share (its holder's pod UID) until the share is allocated
//     again (forget, from Allocate: the kubelet gives the device to a new container) or the
//     keeper sees it freed (forgetFreed);
//   - a "no" is remembered per (share, pod) for refusedFor, at most maxRefused entries, and
//     forgotten too when the share is allocated again (its new holder may have asked before);
//   - Lists are single-flight: registrations that come while one is under way share its answer,
//     but only a List that began after the question answers it (a container that just started
//     must not be refused on an answer older than its allocation).
type holderAnswers struct {
	mu      sync.Mutex
	now     func() time.Time // nil: time.Now
	held    map[string]string
	refused map[[2]string]refusal
	last    *listCall // the newest List, done or under way
	// lists and gets count the kubelet's Lists and the API server's GETs (tests, figures).
	lists, gets atomic.Int64
}

type refusal struct {
	until time.Time
	err   error
}

// listCall is one List: others wait on done for its answer.
type listCall struct {
	started time.Time
	done    chan struct{}
	resp    *podresourcesapi.ListPodResourcesResponse
	err     error
}

const (
	refusedFor = time.Second
	maxRefused = 1024
)

func (a *holderAnswers) clock() time.Time {
	if a.now == nil {
		return time.Now()
	}
	return a.now()
}

// cached answers from memory when it can: ok reports whether it did.
func (a *holderAnswers) cached(shareID, podUID string, now time.Time) (ok bool, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.held[shareID] == podUID && podUID != "" {
		return true, nil
	}
	if r, found := a.refused[[2]string{shareID, podUID}]; found {
		if now.Before(r.until) {
			return true, r.err
		}
		delete(a.refused, [2]string{shareID, podUID})
	}
	return false, nil
}

// record remembers a definite answer; an error that is not ErrNotHolder (the kubelet or the
// API server did not answer) is not an answer.
func (a *holderAnswers) record(shareID, podUID string, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case err == nil:
		if a.held == nil {
			a.held = map[string]string{}
		}
		a.held[shareID] = podUID
	case errors.Is(err, registry.ErrNotHolder):
		if a.refused == nil || len(a.refused) >= maxRefused {
			a.refused = map[[2]string]refusal{}
		}
		a.refused[[2]string{shareID, podUID}] = refusal{until: a.clock().Add(refusedFor), err: err}
	}
}

// forget drops what is remembered of the shares with these device IDs (they were just
// allocated to a container).
func (a *holderAnswers) forget(ids []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, id := range ids {
		delete(a.held, id)
		for k := range a.refused {
			if k[0] == id {
				delete(a.refused, k)
			}
		}
	}
}

// forgetFreed drops the remembered holders of shares no container holds now (the keeper's
// pass: held are the share IDs the kubelet lists).
func (a *holderAnswers) forgetFreed(held map[string]bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id := range a.held {
		if !held[id] {
			delete(a.held, id)
		}
	}
}

// listSince returns the answer of a List that began at or after since: the one under way if
// it did, else a new one once any older one is done (one at a time).
func (a *holderAnswers) listSince(ctx context.Context, since time.Time, list func(context.Context) (*podresourcesapi.ListPodResourcesResponse, error)) (*podresourcesapi.ListPodResourcesResponse, error) {
	for {
		a.mu.Lock()
		c := a.last
		if c == nil || c.started.Before(since) {
			select {
			case <-doneOf(c):
				// done, but older than the question: a new List
				c = &listCall{started: a.clock(), done: make(chan struct{})}
				a.last = c
				a.mu.Unlock()
				c.resp, c.err = list(ctx)
				close(c.done)
				return c.resp, c.err
			default:
				// one under way that began before the question: wait for it, then ask anew
			}
		}
		a.mu.Unlock()
		select {
		case <-c.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if !c.started.Before(since) {
			return c.resp, c.err
		}
	}
}

// doneOf is c's done channel, or a closed one for no call.
func doneOf(c *listCall) <-chan struct{} {
	if c == nil {
		return closed
	}
	return c.done
}

var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()
