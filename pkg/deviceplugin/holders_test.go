package deviceplugin

import (
	"context"
	"errors"
	"testing"

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
