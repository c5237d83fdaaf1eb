package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
)

// Names of the serving certificate's files in the certificate directory: those of a
// kubernetes.io/tls Secret, which both cert-manager and cert-controller's rotator write.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// servingCert keeps the webhook's serving certificate loaded from a directory that someone else
// keeps up to date (the kubelet from a mounted Secret, or secretMirror): controller-runtime's
// certwatcher reloads it when the files change, so a rotated certificate is served without a
// restart, and a file that does not parse leaves the previous certificate in use.
type servingCert struct {
	dir     string
	watcher atomic.Pointer[certwatcher.CertWatcher]
}

// GetCertificate is the TLS server's tls.Config.GetCertificate.
func (c *servingCert) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if w := c.watcher.Load(); w != nil {
		if cert, err := w.GetCertificate(hello); cert != nil || err != nil {
			return cert, err
		}
	}
	return nil, errors.New("no serving certificate loaded yet")
}

// Check is the readiness check: a certificate is loaded.
func (c *servingCert) Check(context.Context) error {
	if c.watcher.Load() == nil {
		return fmt.Errorf("no serving certificate loaded from %s yet", c.dir)
	}
	return nil
}

// watch loads the certificate as soon as both files are there (checking every second) and then
// follows their changes until ctx ends.
func (c *servingCert) watch(ctx context.Context) {
	logger := klog.FromContext(ctx).WithValues("dir", c.dir)
	crt, key := filepath.Join(c.dir, CertFile), filepath.Join(c.dir, KeyFile)
	var lastErr string
	_ = wait.PollUntilContextCancel(ctx, time.Second, true, func(context.Context) (bool, error) {
		w, err := certwatcher.New(crt, key)
		if err != nil {
			if err.Error() != lastErr {
				logger.Info("Waiting for the serving certificate", "err", err)
				lastErr = err.Error()
			}
			return false, nil
		}
		c.watcher.Store(w)
		return true, nil
	})
	w := c.watcher.Load()
	if w == nil {
		return
	}
	logger.Info("Serving certificate loaded")
	if err := w.Start(ctx); err != nil {
		logger.Error(err, "Watching the serving certificate failed: rotated certificates are no longer loaded")
	}
}

// writeCertDir puts a certificate and key into dir the way the kubelet updates a Secret
// volume, so that a reader never sees a new certificate with an old key: both files go into a
// fresh directory, the symlink "..data" is switched to it in one rename, and dir/tls.crt and
// dir/tls.key point through "..data". Removing the previous directory then wakes certwatcher,
// whose inotify watches follow the symlinks to the old files.
func writeCertDir(dir string, cert, key []byte) error {
	fresh, err := os.MkdirTemp(dir, "..cert-")
	if err != nil {
		return fmt.Errorf("create a directory for the certificate: %w", err)
	}
	for name, data := range map[string][]byte{CertFile: cert, KeyFile: key} {
		if err := os.WriteFile(filepath.Join(fresh, name), data, 0o600); err != nil {
			return errors.Join(fmt.Errorf("write %s: %w", name, err), os.RemoveAll(fresh))
		}
	}
	data := filepath.Join(dir, "..data")
	previous, _ := os.Readlink(data)
	tmp := data + ".tmp"
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Base(fresh), tmp); err != nil {
		return errors.Join(fmt.Errorf("link the new certificate: %w", err), os.RemoveAll(fresh))
	}
	if err := os.Rename(tmp, data); err != nil {
		return errors.Join(fmt.Errorf("switch to the new certificate: %w", err), os.RemoveAll(fresh))
	}
	for _, name := range []string{CertFile, KeyFile} {
		link := filepath.Join(dir, name)
		if target, err := os.Readlink(link); err == nil && target == filepath.Join("..data", name) {
			continue
		}
		_ = os.Remove(link)
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			return fmt.Errorf("link %s: %w", name, err)
		}
	}
	if previous != "" && previous != filepath.Base(fresh) {
		if err := os.RemoveAll(filepath.Join(dir, previous)); err != nil {
			return fmt.Errorf("remove the previous certificate: %w", err)
		}
	}
	return nil
}
