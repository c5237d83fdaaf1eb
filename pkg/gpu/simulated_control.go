package gpu

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// SimulatedGPU is one simulated GPU as the control endpoint lists it.
type SimulatedGPU struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
}

// ControlHandler lets a test or a demonstration drive the simulated GPUs' health from outside
// the process (contract §11, the simulated-GPU control socket):
//
//	GET  /gpus                                      the GPUs, as JSON [{"index","uuid"}]
//	POST /gpus/{uuid}/xid/{xid}                     SetHealth(uuid, false, xid)
//	POST /gpus/{uuid}/healthy                       SetHealth(uuid, true, 0)
//	POST /gpus/{uuid}/recovery-action/{action}      SetRecoveryAction(uuid, action), action as NVML's number
//
// A bad request is answered 400 with the reason; a success 204.
func (s *Simulated) ControlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /gpus", func(w http.ResponseWriter, _ *http.Request) {
		out := make([]SimulatedGPU, 0, len(s.visible))
		for _, d := range s.visible {
			out = append(out, SimulatedGPU{Index: d.Index, UUID: d.UUID})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})
	mux.HandleFunc("POST /gpus/{uuid}/xid/{xid}", func(w http.ResponseWriter, r *http.Request) {
		xid, err := strconv.ParseUint(r.PathValue("xid"), 10, 64)
		if err != nil {
			http.Error(w, fmt.Sprintf("XID %q is not a number", r.PathValue("xid")), http.StatusBadRequest)
			return
		}
		answer(w, s.SetHealth(r.PathValue("uuid"), false, xid))
	})
	mux.HandleFunc("POST /gpus/{uuid}/healthy", func(w http.ResponseWriter, r *http.Request) {
		answer(w, s.SetHealth(r.PathValue("uuid"), true, 0))
	})
	mux.HandleFunc("POST /gpus/{uuid}/recovery-action/{action}", func(w http.ResponseWriter, r *http.Request) {
		action, err := strconv.ParseInt(r.PathValue("action"), 10, 32)
		if err != nil {
			http.Error(w, fmt.Sprintf("recovery action %q is not a number", r.PathValue("action")), http.StatusBadRequest)
			return
		}
		answer(w, s.SetRecoveryAction(r.PathValue("uuid"), nvml.DeviceGpuRecoveryAction(action)))
	})
	return mux
}

func answer(w http.ResponseWriter, err error) {
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
