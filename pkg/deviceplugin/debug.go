package deviceplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/go-logr/logr"

	"github.com/vgpu-dra/vgpu-dra/pkg/gpu"
)

// DebugState is what GET / on the debug endpoint answers (contract §13).
type DebugState struct {
	Resource   string `json:"resource"`
	Registered bool   `json:"registered"`
	// Registrations counts the registrations the kubelet accepted since the plugin started.
	Registrations int64  `json:"registrations"`
	LastError     string `json:"lastError,omitempty"`
	// Streams is the number of ListAndWatch streams open.
	Streams int64 `json:"streams"`
	// UnhealthyGPUs maps a GPU's UUID to why it is unhealthy.
	UnhealthyGPUs map[string]string `json:"unhealthyGPUs"`
	Shares        []DebugShare      `json:"shares"`
}

// DebugShare is one share in DebugState.
type DebugShare struct {
	ID          string `json:"id"`
	UID         string `json:"uid"`
	GPUIndex    int    `json:"gpuIndex"`
	MemoryBytes int64  `json:"memoryBytes"`
	Cores       int64  `json:"cores"`
	Healthy     bool   `json:"healthy"`
}

// debugState is the state now.
func (p *Plugin) debugState() DebugState {
	ok, lastErr := p.endpoint.registered()
	st := DebugState{Resource: p.cfg.ResourceName, Registered: ok, Registrations: p.endpoint.accepted.Load(),
		Streams: p.endpoint.streams.Load(), UnhealthyGPUs: p.devices.unhealthyGPUs()}
	if lastErr != nil {
		st.LastError = lastErr.Error()
	}
	for _, sh := range p.inv.Shares {
		g := p.inv.GPUOf(sh)
		_, bad := st.UnhealthyGPUs[g.Device.UUID]
		st.Shares = append(st.Shares, DebugShare{ID: sh.ID, UID: sh.UID, GPUIndex: g.Device.Index, MemoryBytes: g.MemoryBytes, Cores: g.Cores, Healthy: !bad})
	}
	return st
}

// serveDebug serves the debug endpoint on a unix socket (mode 0600) until ctx ends:
//
//	GET /        the DebugState as JSON
//	POST /health?gpu=<uuid>&healthy=<bool>[&xid=<n>]
//	             simulated GPU sources only: inject a health event through NVML's event path,
//	             as gpu.Simulated.SetHealth does (demos and the e2e suite)
func (p *Plugin) serveDebug(ctx context.Context, path string, logger logr.Logger) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the old debug socket: %w", err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listen on the debug socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = lis.Close()
		return fmt.Errorf("restrict the debug socket: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(p.debugState())
	})
	mux.HandleFunc("POST /health", func(w http.ResponseWriter, r *http.Request) {
		code, err := p.injectHealth(r.URL.Query().Get("gpu"), r.URL.Query().Get("healthy"), r.URL.Query().Get("xid"))
		if err != nil {
			http.Error(w, err.Error(), code)
			return
		}
		logger.Info("Injected a simulated health event", "query", r.URL.RawQuery)
		w.WriteHeader(http.StatusNoContent)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	context.AfterFunc(ctx, func() { _ = srv.Close() })
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error(err, "Debug endpoint stopped", "socket", path)
		}
	}()
	logger.Info("Serving the debug endpoint", "socket", path)
	return nil
}

// injectHealth hands a simulated source a health event.
func (p *Plugin) injectHealth(uuid, healthy, xid string) (int, error) {
	sim, ok := p.gpus.(*gpu.Simulated)
	if !ok {
		return http.StatusConflict, errors.New("health events can be injected only into simulated GPUs")
	}
	h, err := strconv.ParseBool(healthy)
	if err != nil {
		return http.StatusBadRequest, fmt.Errorf("healthy=%q: want true or false", healthy)
	}
	var x uint64
	if xid != "" {
		if x, err = strconv.ParseUint(xid, 10, 64); err != nil {
			return http.StatusBadRequest, fmt.Errorf("xid=%q: want a number", xid)
		}
	}
	if err := sim.SetHealth(uuid, h, x); err != nil {
		return http.StatusBadRequest, err
	}
	return http.StatusNoContent, nil
}
