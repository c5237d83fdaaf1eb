package webhook

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
)

// TestMissingClaimWaitsBounded: with the most lookups already waiting for a missing claim, the
// next one answers ErrNotFound at once instead of waiting too; once a wait ends, lookups wait
// again and find a claim that arrives meanwhile.
func TestMissingClaimWaitsBounded(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	kube := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(kube, 0)
	specs, err := NewCacheSpecs(factory, time.Hour, 1)
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	eventually(t, "the caches to sync", func() error {
		if !specs.Synced() {
			return os.ErrNotExist
		}
		return nil
	})

	waitCtx, endWait := context.WithCancel(ctx)
	first := make(chan error, 1)
	go func() {
		_, err := specs.ClaimSpec(waitCtx, "ns", "never")
		first <- err
	}()
	eventually(t, "the first lookup to wait", func() error {
		if len(specs.waits) != 1 {
			return errors.New("not waiting yet")
		}
		return nil
	})
	second := make(chan error, 1)
	go func() {
		_, err := specs.TemplateSpec(ctx, "ns", "never")
		second <- err
	}()
	select {
	case err := <-second:
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("a lookup beyond the bound: %v, want ErrNotFound", err)
		}
	case err := <-first:
		t.Fatalf("the first lookup ended (%v) before the second answered", err)
	case <-time.After(30 * time.Second):
		t.Fatal("a lookup beyond the bound waited")
	}

	endWait()
	if err := <-first; err == nil || errors.Is(err, ErrNotFound) {
		t.Errorf("the waiting lookup, its context ended: %v", err)
	}
	found := make(chan error, 1)
	go func() {
		_, err := specs.ClaimSpec(ctx, "ns", "late")
		found <- err
	}()
	eventually(t, "the next lookup to wait", func() error {
		if len(specs.waits) != 1 {
			return errors.New("not waiting yet")
		}
		return nil
	})
	if _, err := kube.ResourceV1().ResourceClaims("ns").Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "late", Namespace: "ns"}, Spec: *specsForRules.claims["ns/one"]}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-found; err != nil {
		t.Errorf("a claim created while the slot's next lookup waited: %v", err)
	}
}
