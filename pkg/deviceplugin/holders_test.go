package deviceplugin

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
)

const (
	uidA = "0b5a1c2d-3e4f-4a5b-8c6d-7e8f9a0b1c2d"
	uidB = "1c6b2d3e-4f5a-4b6c-9d7e-8f9a0b1c2d3e"
)

func pod(ns, name, uid string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)}}
}

// TestVerifyHolder: only the pod the kubelet lists with the share, with the UID the API server
// gives that name, holds it; a kubelet or API server that does not answer is not a "no".
func TestVerifyHolder(t *testing.T) {
	share := id(0, 1)
	tests := []struct {
		name       string
		pods       []fakePod
		kubeletErr error
		caller     string
		wantOK     bool
		wantNo     bool // ErrNotHolder
	}{
		{"the holder", []fakePod{{"ns", "a", resource, []string{share}}, {"ns", "b", resource, []string{id(0, 0)}}}, nil, uidA, true, false},
		{"another pod's share", []fakePod{{"ns", "a", resource, []string{share}}, {"ns", "b", resource, []string{id(0, 0)}}}, nil, uidB, false, true},
		{"held by no one", []fakePod{{"ns", "b", resource, []string{id(0, 0)}}}, nil, uidB, false, true},
		{"same ID under another resource", []fakePod{{"ns", "b", "example.com/gpu", []string{share}}}, nil, uidB, false, true},
		{"two pods of one name", []fakePod{{"ns", "a", resource, []string{share}}, {"ns", "a", resource, nil}}, nil, uidA, false, true},
		{"listed for two pods", []fakePod{{"ns", "a", resource, []string{share}}, {"ns", "b", resource, []string{share}}}, nil, uidA, false, true},
		{"pod gone from the API", []fakePod{{"ns", "gone", resource, []string{share}}}, nil, uidA, false, true},
		{"kubelet down", nil, errors.New("connection refused"), uidA, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := &fakeKubelet{err: tc.kubeletErr}
			k.set(tc.pods...)
			h := &holders{kubelet: k, kube: fake.NewClientset(pod("ns", "a", uidA), pod("ns", "b", uidB)), resource: resource}
			err := h.verify(context.Background(), share, tc.caller)
			if (err == nil) != tc.wantOK || errors.Is(err, registry.ErrNotHolder) != tc.wantNo {
				t.Errorf("verify = %v; want ok %v, ErrNotHolder %v", err, tc.wantOK, tc.wantNo)
			}
		})
	}
}

// TestShareTargets: a register UUID resolves to its share's config directory without asking the
// kubelet (the registry prunes through it every second); the holder check asks for that share.
func TestShareTargets(t *testing.T) {
	inv := testInventory(t, 1, 2)
	k := &fakeKubelet{}
	k.set(fakePod{"ns", "a", resource, []string{id(0, 1)}})
	layout := claimdir.Layout{StateDir: "/var/lib/vgpu-dra"}
	tg := shareTargets{inv: inv, layout: layout, holders: &holders{kubelet: k, kube: fake.NewClientset(pod("ns", "a", uidA)), resource: resource}}
	sh := inv.byID[id(0, 1)]
	c, ok := tg.ClaimByRegisterUUID(sh.UID)
	dirs, _ := layout.PerClaimDirs(sh.UID)
	if !ok || c.UID != sh.UID || c.ConfigDir != dirs.Config || c.VerifyHolder == nil {
		t.Fatalf("ClaimByRegisterUUID = %+v, %v", c, ok)
	}
	if err := c.VerifyHolder(context.Background(), uidA); err != nil {
		t.Errorf("holder: %v", err)
	}
	other, _ := tg.ClaimByRegisterUUID(inv.byID[id(0, 0)].UID)
	if err := other.VerifyHolder(context.Background(), uidA); !errors.Is(err, registry.ErrNotHolder) {
		t.Errorf("pod a for the share it does not hold: %v", err)
	}
	if _, ok := tg.ClaimByRegisterUUID(uidA); ok {
		t.Error("a UUID that is no share's resolved")
	}
}

// TestHolderChecksAreBounded: a container that re-registers in a loop must not cost the kubelet
// a pod-resources List and the API server a GET each time. The holder's repeats are answered
// from memory until the keeper sees its share freed; a non-holder's refusal is remembered for a
// second; registrations that come together share one List; and a refusal is never decided on a
// List older than the question.
func TestHolderChecksAreBounded(t *testing.T) {
	share, other := id(0, 1), id(0, 0)
	k := &fakeKubelet{}
	k.set(fakePod{"ns", "a", resource, []string{share}})
	clock := &fakeClock{now: time.Unix(1000, 0)}
	h := &holders{kubelet: k, kube: fake.NewClientset(pod("ns", "a", uidA), pod("ns", "b", uidB)), resource: resource}
	h.answers.now = clock.Now
	ctx := context.Background()
	costs := func() (int64, int64) { return h.answers.lists.Load(), h.answers.gets.Load() }

	for range 200 {
		if err := h.verify(ctx, share, uidA); err != nil {
			t.Fatalf("the holder: %v", err)
		}
	}
	if l, g := costs(); l != 1 || g != 1 {
		t.Errorf("200 registrations of the holder cost %d Lists and %d GETs, want 1 and 1", l, g)
	}
	clock.add(time.Millisecond) // the clock moves between questions, as a real one does
	for range 200 {
		if err := h.verify(ctx, share, uidB); !errors.Is(err, registry.ErrNotHolder) {
			t.Fatalf("a non-holder: %v", err)
		}
	}
	if l, g := costs(); l != 2 || g != 2 {
		t.Errorf("then 200 of a non-holder within a second cost %d Lists and %d GETs in all, want 2 and 2", l, g)
	}
	clock.add(1100 * time.Millisecond)
	if err := h.verify(ctx, share, uidB); !errors.Is(err, registry.ErrNotHolder) {
		t.Fatalf("a non-holder a second later: %v", err)
	}
	if l, _ := costs(); l != 3 {
		t.Errorf("a refusal a second old was not asked again (%d Lists, want 3)", l)
	}

	// 50 registrations at once from a pod that holds nothing: one List between them, or a
	// few if they straddle one.
	before, _ := costs()
	clock.add(time.Millisecond)
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h.verify(ctx, other, uidB); !errors.Is(err, registry.ErrNotHolder) {
				t.Errorf("concurrent non-holder: %v", err)
			}
		}()
	}
	wg.Wait()
	if l, _ := costs(); l-before > 2 {
		t.Errorf("50 concurrent registrations cost %d Lists, want at most 2", l-before)
	}

	// Pod b is given the other share: its first question about it is asked anew, not refused
	// on what was remembered of another share.
	k.set(fakePod{"ns", "a", resource, []string{share}}, fakePod{"ns", "b", resource, []string{other}})
	clock.add(1100 * time.Millisecond)
	if err := h.verify(ctx, other, uidB); err != nil {
		t.Errorf("the new holder of the other share: %v", err)
	}
	// Pod a's share is freed: once the keeper has seen it, pod a is asked about anew.
	k.set(fakePod{"ns", "b", resource, []string{other}})
	h.answers.forgetFreed(map[string]bool{other: true})
	clock.add(time.Millisecond)
	if err := h.verify(ctx, share, uidA); !errors.Is(err, registry.ErrNotHolder) {
		t.Errorf("the holder of a freed share: %v, want refused", err)
	}
}
