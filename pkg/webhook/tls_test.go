package webhook

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/klog/v2/ktesting"
)

// TestSecretMirror: a Secret's pair reaches the directory through "..data", an invalid or
// incomplete pair (the rotator has not filled the Secret yet) leaves the directory alone, and a
// new pair replaces the old one without leaving its directory behind.
func TestSecretMirror(t *testing.T) {
	logger, _ := ktesting.NewTestContext(t)
	dir := filepath.Join(t.TempDir(), "tls")
	m := &secretMirror{dir: dir, logger: logger}
	secret := func(cert, key []byte) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "tls", Namespace: "ns"}, Data: map[string][]byte{CertFile: cert, KeyFile: key}}
	}
	m.sync(secret(nil, nil))
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("an empty Secret created the directory: %v", err)
	}
	cert1, key1 := mustCert(t)
	cert2, key2 := mustCert(t)
	m.sync(secret(cert1, key2)) // not a pair
	if _, err := os.Stat(filepath.Join(dir, CertFile)); !os.IsNotExist(err) {
		t.Fatalf("a mismatched pair was written: %v", err)
	}
	m.sync(secret(cert1, key1))
	assertFile(t, filepath.Join(dir, CertFile), cert1)
	assertFile(t, filepath.Join(dir, KeyFile), key1)
	first, _ := os.Readlink(filepath.Join(dir, "..data"))
	m.sync(secret(cert2, key2))
	assertFile(t, filepath.Join(dir, CertFile), cert2)
	assertFile(t, filepath.Join(dir, KeyFile), key2)
	if _, err := os.Stat(filepath.Join(dir, first)); !os.IsNotExist(err) {
		t.Errorf("the previous certificate directory %s is still there: %v", first, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 4 { // tls.crt, tls.key, ..data, ..cert-*
		t.Errorf("directory holds %d entries, want 4: %v", len(entries), entries)
	}
	if info, err := os.Stat(filepath.Join(dir, KeyFile)); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("key file mode: %v %v", info, err)
	}
}

func mustCert(t *testing.T) ([]byte, []byte) {
	t.Helper()
	cert, key, err := certutil.GenerateSelfSignedCertKey(testDNSName, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func assertFile(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil || string(got) != string(want) {
		t.Errorf("%s: %v, content differs: %v", path, err, string(got) != string(want))
	}
}

// TestCacheSpecs: lookups come from the informer caches; a missing object is ErrNotFound after
// the wait bound, and one that arrives within it is found.
func TestCacheSpecs(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	kube := fake.NewClientset(&resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: "ns"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: *specsForRules.claims["ns/two"]}})
	factory := informers.NewSharedInformerFactory(kube, 0)
	specs, err := NewCacheSpecs(factory, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if specs.Synced() {
		t.Fatal("synced before the informers started")
	}
	factory.Start(ctx.Done())
	eventually(t, "the caches to sync", func() error {
		if !specs.Synced() {
			return os.ErrNotExist
		}
		return nil
	})
	got, err := specs.TemplateSpec(ctx, "ns", "t")
	if err != nil || len(got.Devices.Requests) != 2 {
		t.Fatalf("TemplateSpec = %v, %v", got, err)
	}
	if _, err := specs.ClaimSpec(ctx, "ns", "nope"); err != ErrNotFound {
		t.Errorf("a missing claim with no wait: %v, want ErrNotFound", err)
	}

	specs.wait = time.Minute
	found := make(chan error, 1)
	go func() {
		_, err := specs.ClaimSpec(ctx, "ns", "late")
		found <- err
	}()
	if _, err := kube.ResourceV1().ResourceClaims("ns").Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "late", Namespace: "ns"}, Spec: *specsForRules.claims["ns/one"]}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-found:
		if err != nil {
			t.Errorf("a claim created during the wait: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a claim created during the wait was not found")
	}
}
