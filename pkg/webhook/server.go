package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"time"

	"k8s.io/klog/v2"
)

// httpsServer serves the webhook paths over TLS with a certificate that can change under it.
type httpsServer struct {
	srv  *http.Server
	addr net.Addr
}

// serveHTTPS listens on address and serves handler with the certificate getCert returns at each
// handshake. The API server verifies it against the webhook configuration's caBundle.
func serveHTTPS(ctx context.Context, address string, handler http.Handler, getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)) (*httpsServer, error) {
	lis, err := net.Listen("tcp", address)
	if err != nil {
		return nil, fmt.Errorf("listen for admission reviews on %s: %w", address, err)
	}
	logger := klog.FromContext(ctx)
	srv := &http.Server{
		Handler:           handler,
		TLSConfig:         &tls.Config{GetCertificate: getCert, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		// The API server keeps connections open between reviews; an idle one costs nothing.
		IdleTimeout: 2 * time.Minute,
		ErrorLog:    log.New(logWriter{logger.V(2)}, "", 0),
	}
	go func() {
		if err := srv.ServeTLS(lis, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error(err, "Admission server stopped", "address", address)
		}
	}()
	logger.Info("Serving admission reviews", "address", lis.Addr().String())
	return &httpsServer{srv: srv, addr: lis.Addr()}, nil
}

// shutdown stops accepting and waits, up to timeout, for reviews in flight.
func (s *httpsServer) shutdown(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		return fmt.Errorf("stop the admission server: %w", err)
	}
	return nil
}

// logWriter turns the HTTP server's own messages (TLS handshake errors, for instance from a
// client that does not trust a certificate yet) into log lines at a verbosity.
type logWriter struct{ logger klog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.logger.Info("HTTP server", "msg", strings.TrimSpace(string(p)))
	return len(p), nil
}
