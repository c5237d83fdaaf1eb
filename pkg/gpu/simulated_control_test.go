package gpu

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestControlHandler drives simulated health through the control endpoint: each request
// becomes the health event SetHealth or SetRecoveryAction would send; a bad one is a 400.
func TestControlHandler(t *testing.T) {
	sim := newWatchedSimulated(t, 2)
	events := watch(t, sim)
	srv := httptest.NewServer(sim.ControlHandler())
	defer srv.Close()
	uuid := sim.visible[1].UUID

	resp, err := http.Get(srv.URL + "/gpus")
	if err != nil {
		t.Fatal(err)
	}
	var gpus []SimulatedGPU
	err = json.NewDecoder(resp.Body).Decode(&gpus)
	resp.Body.Close()
	if err != nil || len(gpus) != 2 || gpus[1] != (SimulatedGPU{Index: 1, UUID: uuid}) {
		t.Fatalf("GET /gpus = %+v (%v)", gpus, err)
	}
	tests := []struct {
		path       string
		wantStatus int
		want       *HealthEvent
	}{
		{"/gpus/" + uuid + "/xid/92", http.StatusNoContent, &HealthEvent{UUID: uuid, Reason: "XID 92"}},
		{"/gpus/" + uuid + "/healthy", http.StatusNoContent, &HealthEvent{UUID: uuid, Healthy: true, Reason: "marked healthy"}},
		{"/gpus/" + uuid + "/recovery-action/1", http.StatusNoContent, &HealthEvent{UUID: uuid, Fatal: true, Reason: "recovery action GPU reset"}},
		{"/gpus/" + uuid + "/recovery-action/0", http.StatusNoContent, &HealthEvent{UUID: uuid, Healthy: true, Reason: "recovery action back to none"}},
		{"/gpus/" + uuid + "/xid/many", http.StatusBadRequest, nil},
		{"/gpus/GPU-nope/xid/79", http.StatusBadRequest, nil},
	}
	for _, tt := range tests {
		resp, err := http.Post(srv.URL+tt.path, "text/plain", strings.NewReader(""))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.wantStatus {
			t.Errorf("POST %s = %d, want %d", tt.path, resp.StatusCode, tt.wantStatus)
		}
		if tt.want != nil {
			if got := next(t, events); got != *tt.want {
				t.Errorf("POST %s: event %+v, want %+v", tt.path, got, *tt.want)
			}
		}
	}
}
