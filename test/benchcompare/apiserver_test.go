//go:build benchcompare

package benchcompare

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// apiServer is an etcd and a kube-apiserver of the cluster's binaries, on free loopback ports,
// with state and certificates in a temp dir; both are stopped by PID at cleanup.
type apiServer struct {
	url        string
	kubeconfig string // admin (system:masters), for the drivers
	config     *rest.Config
	http       *http.Client // admin, for /metrics
}

// startAPIServer runs etcd and kube-apiserver from binDir.
func startAPIServer(b *testing.B, binDir, dir string) *apiServer {
	b.Helper()
	pki := filepath.Join(dir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		b.Fatal(err)
	}
	ca, caKey := newCA(b, pki)
	issue(b, pki, "apiserver", ca, caKey, pkix.Name{CommonName: "kube-apiserver"}, x509.ExtKeyUsageServerAuth)
	issue(b, pki, "admin", ca, caKey, pkix.Name{CommonName: "vgpu-bench-admin", Organization: []string{"system:masters"}}, x509.ExtKeyUsageClientAuth)
	saKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	writeKey(b, filepath.Join(pki, "sa.key"), saKey)
	pub, _ := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	writePEM(b, filepath.Join(pki, "sa.pub"), "PUBLIC KEY", pub)

	etcdClient, etcdPeer, apiPort := freePort(b), freePort(b), freePort(b)
	etcd := startProc(b, "etcd", filepath.Join(binDir, "etcd"), nil,
		"--name", "bench", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdClient),
		"--advertise-client-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdClient),
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdPeer),
		"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", etcdPeer),
		"--initial-cluster", fmt.Sprintf("bench=http://127.0.0.1:%d", etcdPeer),
		// As the local cluster's etcd (hack/cluster-up.sh): a throwaway store on a shared disk.
		"--unsafe-no-fsync", "--log-level", "warn")
	apiserver := startProc(b, "kube-apiserver", filepath.Join(binDir, "kube-apiserver"), nil,
		"--etcd-servers", fmt.Sprintf("http://127.0.0.1:%d", etcdClient),
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", fmt.Sprint(apiPort),
		"--tls-cert-file", filepath.Join(pki, "apiserver.crt"), "--tls-private-key-file", filepath.Join(pki, "apiserver.key"),
		"--client-ca-file", filepath.Join(pki, "ca.crt"),
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", filepath.Join(pki, "sa.pub"), "--service-account-signing-key-file", filepath.Join(pki, "sa.key"),
		"--service-cluster-ip-range", "10.96.0.0/24", "--authorization-mode", "RBAC", "--profiling=false",
		// No kubernetes Service endpoint: nothing here reaches the API server through it, and it
		// cannot point at a loopback address.
		"--endpoint-reconciler-type=none")

	s := &apiServer{url: fmt.Sprintf("https://127.0.0.1:%d", apiPort), kubeconfig: filepath.Join(dir, "admin.kubeconfig")}
	s.config = &rest.Config{Host: s.url, TLSClientConfig: rest.TLSClientConfig{
		CAFile: filepath.Join(pki, "ca.crt"), CertFile: filepath.Join(pki, "admin.crt"), KeyFile: filepath.Join(pki, "admin.key"),
	}, QPS: -1}
	kubeconfig := strings.Join([]string{
		"apiVersion: v1", "kind: Config",
		"clusters:", "- name: bench", "  cluster:", "    server: " + s.url, "    certificate-authority: " + filepath.Join(pki, "ca.crt"),
		"users:", "- name: admin", "  user:", "    client-certificate: " + filepath.Join(pki, "admin.crt"), "    client-key: " + filepath.Join(pki, "admin.key"),
		"contexts:", "- name: bench", "  context:", "    cluster: bench", "    user: admin", "current-context: bench", "",
	}, "\n")
	if err := os.WriteFile(s.kubeconfig, []byte(kubeconfig), 0o600); err != nil {
		b.Fatal(err)
	}
	transport, err := rest.TransportFor(s.config)
	if err != nil {
		b.Fatal(err)
	}
	s.http = &http.Client{Transport: transport, Timeout: 5 * time.Second}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := s.http.Get(s.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if apiserver.exited() || etcd.exited() || time.Now().After(deadline) {
			b.Fatalf("kube-apiserver not ready (%v); etcd:\n%s\nkube-apiserver:\n%s", err, etcd.tail(), apiserver.tail())
		}
		time.Sleep(300 * time.Millisecond)
	}
	return s
}

// requests is the API server's count of requests it served (apiserver_request_total, all
// labels): the difference over a phase is what the clients of that phase asked for.
func (s *apiServer) requests(ctx context.Context, b *testing.B) float64 {
	b.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/metrics", nil)
	resp, err := s.http.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		b.Fatal(err)
	}
	total := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
			total += v
		}
	}
	return total
}

func freePort(b *testing.B) int {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func newCA(b *testing.B, dir string) (*x509.Certificate, *ecdsa.PrivateKey) {
	b.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "vgpu-bench-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		b.Fatal(err)
	}
	writePEM(b, filepath.Join(dir, "ca.crt"), "CERTIFICATE", der)
	ca, _ := x509.ParseCertificate(der)
	return ca, key
}

var serial int64 = 1

func issue(b *testing.B, dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, subject pkix.Name, usage x509.ExtKeyUsage) {
	b.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: subject,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		b.Fatal(err)
	}
	writePEM(b, filepath.Join(dir, name+".crt"), "CERTIFICATE", der)
	writeKey(b, filepath.Join(dir, name+".key"), key)
}

func writeKey(b *testing.B, path string, key *ecdsa.PrivateKey) {
	b.Helper()
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		b.Fatal(err)
	}
	writePEM(b, path, "EC PRIVATE KEY", der)
}

func writePEM(b *testing.B, path, typ string, der []byte) {
	b.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		b.Fatal(err)
	}
}
