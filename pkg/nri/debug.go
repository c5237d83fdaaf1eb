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

// ServeDebug serves DebugState as JSON on a unix socket (mode 0600) until ctx ends:
//
//	curl -s --unix-socket /var/lib/vgpu-dra/debug.sock http://localhost/
func ServeDebug(ctx context.Context, path string, state func() DebugState) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale debug socket %s: %w", path, err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listen on debug socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		lis.Close()
		return fmt.Errorf("set mode of debug socket %s: %w", path, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(state())
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
		_ = os.Remove(path)
	}()
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Debug server stopped", "socket", path)
		}
	}()
	return nil
}
