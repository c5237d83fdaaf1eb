package nri

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// DebugState is what the debug endpoint answers.
type DebugState struct {
	NRI         Status     `json:"nri"`
	CacheSynced bool       `json:"cacheSynced"`
	Cache       []Instance `json:"cache"`
	Claims      []Claim    `json:"claims"`
}

// DebugState collects the connection state, the cache and the prepared claims with their path.
func (s *Supervisor) DebugState() DebugState {
	return DebugState{
		NRI: s.Status(), CacheSynced: s.plugin.cache.Synced(),
		Cache: s.plugin.cache.List(), Claims: s.plugin.claimSource().List(),
	}
}

// ServeDebug serves DebugState as JSON on a unix socket (mode 0600) until ctx ends or the
// returned stop is called; stop returns once the server is closed and its socket removed, so
// that another process may bind the path right after (a handover, contract §14):
//
//	curl -s --unix-socket /var/lib/vgpu-dra/debug.sock http://localhost/
func ServeDebug(ctx context.Context, path string, state func() DebugState) (stop func(), err error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("remove stale debug socket %s: %w", path, err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on debug socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		lis.Close()
		return nil, fmt.Errorf("set mode of debug socket %s: %w", path, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(state())
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return ServeUntil(ctx, srv, lis, path, "Debug"), nil
}

// ServeUntil serves srv on the unix listener lis at path until ctx ends or the returned stop is
// called (both are safe, once or many times); either closes the server and removes path — the
// listener's own, never one another process has bound since (stop runs before that can happen).
func ServeUntil(ctx context.Context, srv *http.Server, lis net.Listener, path, what string) (stop func()) {
	if ul, ok := lis.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = srv.Close()
			_ = os.Remove(path)
		})
	}
	context.AfterFunc(ctx, stop)
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, what+" server stopped", "socket", path)
		}
	}()
	return stop
}
