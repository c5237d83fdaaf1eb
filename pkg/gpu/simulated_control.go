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
//	POST /gpus/{uuid}/processes/{pid}?memory=B&sm=P  SetProcessUsage: the host process pid holds B bytes
//	                                                (and keeps P % of the SMs busy) until it exits
//	DELETE /gpus/{uuid}/processes/{pid}              SetProcessUsage(uuid, pid, 0, nil): forgotten
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
	mux.HandleFunc("POST /gpus/{uuid}/processes/{pid}", func(w http.ResponseWriter, r *http.Request) {
		pid, err := strconv.Atoi(r.PathValue("pid"))
		if err != nil {
			http.Error(w, fmt.Sprintf("PID %q is not a number", r.PathValue("pid")), http.StatusBadRequest)
			return
		}
		bytes, err := strconv.ParseUint(r.URL.Query().Get("memory"), 10, 64)
		if err != nil {
			http.Error(w, fmt.Sprintf("memory=%q: want the bytes the process holds", r.URL.Query().Get("memory")), http.StatusBadRequest)
			return
		}
		var sm *uint32
		if v := r.URL.Query().Get("sm"); v != "" {
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				http.Error(w, fmt.Sprintf("sm=%q: want a percentage", v), http.StatusBadRequest)
				return
			}
			u := uint32(n)
			sm = &u
		}
		answer(w, s.SetProcessUsage(r.PathValue("uuid"), pid, bytes, sm))
	})
	mux.HandleFunc("DELETE /gpus/{uuid}/processes/{pid}", func(w http.ResponseWriter, r *http.Request) {
		pid, err := strconv.Atoi(r.PathValue("pid"))
		if err != nil {
			http.Error(w, fmt.Sprintf("PID %q is not a number", r.PathValue("pid")), http.StatusBadRequest)
			return
		}
		answer(w, s.SetProcessUsage(r.PathValue("uuid"), pid, 0, nil))
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
