package plugin

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

const (
	podOne = "9d8c7b6a-5f4e-4d3c-ab1a-0f9e8d7c6b51"
	podTwo = "9d8c7b6a-5f4e-4d3c-ab1a-0f9e8d7c6b52"
)

// TestReservedForDoesNotWaitOnTheCheckpoint: the NRI hook's re-read of a claim answers as soon as
// the API server does, even while the checkpoint write that records it is stuck (a slow disk,
// a long group commit); the record lands afterwards.
func TestReservedForDoesNotWaitOnTheCheckpoint(t *testing.T) {
	store, err := checkpoint.Open(filepath.Join(t.TempDir(), "checkpoint.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Update(func(d *checkpoint.Data) error {
		d.Claims[testClaim] = checkpoint.Claim{Namespace: "ns", Name: "c", State: checkpoint.PrepareCompleted, Path: contract.PathNRI, ReservedFor: []string{podOne}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	kube := fake.NewClientset(&resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", UID: testClaim},
		Status: resourceapi.ResourceClaimStatus{ReservedFor: []resourceapi.ResourceClaimConsumerReference{
			{Resource: "pods", Name: "one", UID: podOne}, {Resource: "pods", Name: "two", UID: podTwo},
		}},
	})
	rec := newReservedForRecorder(store, klog.Background())
	stuck, written := make(chan struct{}), make(chan struct{})
	rec.set = func(uid string, pods []string) error {
		<-stuck
		defer close(written)
		return store.SetReservedFor(uid, pods)
	}
	claims := checkpointClaims{store: store, kube: kube, recorder: rec}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pods, err := claims.ReservedFor(ctx, testClaim)
	if err != nil || !slices.Equal(pods, []string{podOne, podTwo}) {
		t.Fatalf("ReservedFor = %v, %v; want both pods while the checkpoint write is stuck", pods, err)
	}
	close(stuck)
	<-written
	if c, _ := store.Get(testClaim); !slices.Equal(c.ReservedFor, []string{podOne, podTwo}) {
		t.Errorf("checkpoint records %v, want both pods", c.ReservedFor)
	}
}

// TestReservedForRecorderWritesTheNewestLast: lists recorded one after the other end with the
// newest in the checkpoint, however their background writes interleave.
func TestReservedForRecorderWritesTheNewestLast(t *testing.T) {
	var writes [][]string
	rec := &reservedForRecorder{pending: map[string][]string{}, logger: klog.Background(),
		set: func(_ string, pods []string) error { writes = append(writes, pods); return nil }}
	rec.writeMu.Lock() // hold the writer while three lists are recorded
	for _, pods := range [][]string{{podOne}, {podTwo}, {podOne, podTwo}} {
		rec.record(testClaim, pods)
	}
	rec.writeMu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for {
		rec.writeMu.Lock()
		n := len(writes)
		last := []string(nil)
		if n > 0 {
			last = writes[n-1]
		}
		rec.writeMu.Unlock()
		rec.mu.Lock()
		pending := len(rec.pending)
		rec.mu.Unlock()
		if n > 0 && pending == 0 {
			if !slices.Equal(last, []string{podOne, podTwo}) {
				t.Errorf("last write %v, want the newest list", last)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("nothing written")
		}
		time.Sleep(time.Millisecond)
	}
}
