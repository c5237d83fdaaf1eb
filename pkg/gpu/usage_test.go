package gpu

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestSimulatedProcessUtilization(t *testing.T) {
	sim := newTestSimulated(t, "dgx-h200", 2)
	sim.usage.now = func() uint64 { return 5_000_000 }
	gpu0, gpu1 := mockDevice(sim, 0).UUID, mockDevice(sim, 1).UUID
	hidden := simulatedUUID(testNode, "dgx-h200", 5) // in the profile, beyond count
	sim.SetProcesses(func(uuid string) []SimulatedProcess {
		if uuid == gpu0 {
			// 4243's container may keep 20 % of the SMs busy: 35 % of that share is 7 %.
			return []SimulatedProcess{{PID: 100}, {PID: 114, CoreShare: 100}, {PID: 4243, CoreShare: 20}}
		}
		return nil
	})
	cases := []struct {
		name    string
		uuid    string
		since   uint64
		want    []ProcessSample
		wantErr error
	}{
		{name: "every process, deterministic figures", uuid: gpu0, want: []ProcessSample{
			{PID: 100, SMUtil: 30, TimeStamp: 5_000_000}, // 100 = 5*19 + 5
			{PID: 114, SMUtil: 5, TimeStamp: 5_000_000},  // 114 = 6*19
			{PID: 4243, SMUtil: 7, TimeStamp: 5_000_000}, // 4243 = 223*19 + 6: 35 % of 20
		}},
		{name: "nothing newer than since", uuid: gpu0, since: 5_000_000, want: []ProcessSample{}},
		{name: "a GPU without processes", uuid: gpu1, want: []ProcessSample{}},
		{name: "a GPU beyond count", uuid: hidden, wantErr: ErrUnknownGPU},
		{name: "no such GPU", uuid: "GPU-00000000-0000-0000-0000-000000000000", wantErr: ErrUnknownGPU},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := sim.ProcessUtilization(tc.uuid, tc.since)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("ProcessUtilization = %v, %v; want an error wrapping %v", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ProcessUtilization(%s, %d) = %+v, %v; want %+v", tc.uuid, tc.since, got, err, tc.want)
			}
		})
	}
	// Simulated processes hold no memory NVML could report: the ledger is the only figure.
	want := []ProcessMemory{{PID: 100}, {PID: 114}, {PID: 4243}}
	if mem, err := sim.ProcessMemory(gpu0); err != nil || !reflect.DeepEqual(mem, want) {
		t.Errorf("ProcessMemory of a simulated GPU = %+v, %v; want %+v, none known", mem, err, want)
	}
	sim.SetProcesses(nil)
	if got, err := sim.ProcessUtilization(gpu0, 0); err != nil || len(got) != 0 {
		t.Errorf("after SetProcesses(nil): %+v, %v; want no samples", got, err)
	}
}

func TestSimulatedSMUtilRange(t *testing.T) {
	seen := map[uint32]bool{}
	for pid := range 1000 {
		u := SimulatedSMUtil(pid, 0)
		if u < 5 || u > 95 || u%5 != 0 {
			t.Fatalf("SimulatedSMUtil(%d, 0) = %d, want 5..95 in steps of 5", pid, u)
		}
		seen[u] = true
		// Within a share, a process stays under it: a container that lets the library work is
		// never over its core limit on a simulated GPU.
		for _, share := range []float64{1, 7.5, 30, 99} {
			if s := SimulatedSMUtil(pid, share); float64(s) >= share || s > u {
				t.Fatalf("SimulatedSMUtil(%d, %v) = %d, want under the share and at most %d", pid, share, s, u)
			}
		}
	}
	if len(seen) != 19 {
		t.Errorf("SimulatedSMUtil takes %d values, want 19", len(seen))
	}
}

// TestNVMLProcessReaders drives the shared NVML reader with raw NVML answers, as a real driver
// gives them: several samples of one process, samples older than asked for, figures NVML
// cannot tell, and errors.
func TestNVMLProcessReaders(t *testing.T) {
	sim := newTestSimulated(t, "dgx-h200", 1)
	dev := mockDevice(sim, 0)
	cases := []struct {
		name      string
		samples   []nvml.ProcessUtilizationSample
		sampleRet nvml.Return
		procs     []nvml.ProcessInfo
		procsRet  nvml.Return
		since     uint64
		want      []ProcessSample
		wantMem   []ProcessMemory
		wantErr   bool
		wantMErr  bool
	}{
		{
			name: "newest sample per process, older than since dropped, capped at 100",
			samples: []nvml.ProcessUtilizationSample{
				{Pid: 7, TimeStamp: 10, SmUtil: 40}, {Pid: 7, TimeStamp: 30, SmUtil: 20}, {Pid: 7, TimeStamp: 20, SmUtil: 90},
				{Pid: 8, TimeStamp: 5, SmUtil: 70}, {Pid: 9, TimeStamp: 25, SmUtil: 250},
			},
			sampleRet: nvml.SUCCESS, since: 5,
			procs: []nvml.ProcessInfo{
				{Pid: 7, UsedGpuMemory: 1 << 30}, {Pid: 8, UsedGpuMemory: notAvailable}, {Pid: 9, UsedGpuMemory: 0},
			},
			procsRet: nvml.SUCCESS,
			want:     []ProcessSample{{PID: 7, SMUtil: 20, TimeStamp: 30}, {PID: 9, SMUtil: 100, TimeStamp: 25}},
			wantMem:  []ProcessMemory{{PID: 7, UsedBytes: 1 << 30, Known: true}, {PID: 8}, {PID: 9, UsedBytes: 0, Known: true}},
		},
		{
			name: "no sample since (NOT_FOUND) is not an error", sampleRet: nvml.ERROR_NOT_FOUND,
			procsRet: nvml.SUCCESS, want: []ProcessSample{}, wantMem: []ProcessMemory{},
		},
		{
			name: "driver errors are errors", sampleRet: nvml.ERROR_NOT_SUPPORTED, procsRet: nvml.ERROR_NO_PERMISSION,
			wantErr: true, wantMErr: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dev.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
				return tc.samples, tc.sampleRet
			}
			dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return tc.procs, tc.procsRet }
			got, err := sim.ProcessUtilization(dev.UUID, tc.since)
			if (err != nil) != tc.wantErr || (!tc.wantErr && !reflect.DeepEqual(got, tc.want)) {
				t.Errorf("ProcessUtilization = %+v, %v; want %+v (error %v)", got, err, tc.want, tc.wantErr)
			}
			mem, err := sim.ProcessMemory(dev.UUID)
			if (err != nil) != tc.wantMErr || (!tc.wantMErr && !reflect.DeepEqual(mem, tc.wantMem)) {
				t.Errorf("ProcessMemory = %+v, %v; want %+v (error %v)", mem, err, tc.wantMem, tc.wantMErr)
			}
		})
	}
}

// TestSimulatedProcessUsage: a process a test says holds memory (through the control socket)
// is listed with it next to the containers' processes, with the SM share it was given; when
// it exits the simulated GPU frees its memory, as a real one does; bad requests are refused.
func TestSimulatedProcessUsage(t *testing.T) {
	sim := newTestSimulated(t, "dgx-h200", 2)
	sim.usage.now = func() uint64 { return 7_000_000 }
	gpu0, gpu1 := mockDevice(sim, 0).UUID, mockDevice(sim, 1).UUID
	alive := map[int]bool{100: true, 200: true, 300: true}
	sim.usage.alive = func(pid int) bool { return alive[pid] }
	sim.SetProcesses(func(uuid string) []SimulatedProcess {
		if uuid == gpu0 {
			return []SimulatedProcess{{PID: 100}, {PID: 200, CoreShare: 10}} // 200 is also set: the figure set wins
		}
		return nil
	})
	srv := httptest.NewServer(sim.ControlHandler())
	defer srv.Close()
	post := func(method, path string) int {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for path, want := range map[string]int{
		"/gpus/" + gpu0 + "/processes/200?memory=2147483648&sm=70": http.StatusNoContent,
		"/gpus/" + gpu0 + "/processes/300?memory=1048576":          http.StatusNoContent,
		"/gpus/" + gpu1 + "/processes/300?memory=4096":             http.StatusNoContent,
		"/gpus/" + gpu0 + "/processes/400?memory=1":                http.StatusBadRequest, // no such process
		"/gpus/" + gpu0 + "/processes/300?memory=lots":             http.StatusBadRequest,
		"/gpus/" + gpu0 + "/processes/300?memory=1&sm=101":         http.StatusBadRequest,
		"/gpus/GPU-nope/processes/300?memory=1":                    http.StatusBadRequest,
	} {
		if got := post(http.MethodPost, path); got != want {
			t.Errorf("POST %s = %d, want %d", path, got, want)
		}
	}
	wantMem := []ProcessMemory{{PID: 100}, {PID: 200, UsedBytes: 2 << 30, Known: true}, {PID: 300, UsedBytes: 1 << 20, Known: true}}
	if mem, err := sim.ProcessMemory(gpu0); err != nil || !reflect.DeepEqual(mem, wantMem) {
		t.Errorf("ProcessMemory = %+v, %v; want %+v", mem, err, wantMem)
	}
	samples, err := sim.ProcessUtilization(gpu0, 0)
	wantSM := []ProcessSample{{PID: 100, SMUtil: SimulatedSMUtil(100, 0), TimeStamp: 7_000_000},
		{PID: 200, SMUtil: 70, TimeStamp: 7_000_000}, {PID: 300, SMUtil: 0, TimeStamp: 7_000_000}}
	if err != nil || !reflect.DeepEqual(samples, wantSM) {
		t.Errorf("ProcessUtilization = %+v, %v; want %+v", samples, err, wantSM)
	}
	// Process 300 exits: both GPUs free its memory.
	alive[300] = false
	wantMem = wantMem[:2]
	if mem, _ := sim.ProcessMemory(gpu0); !reflect.DeepEqual(mem, wantMem) {
		t.Errorf("after process 300 exited: %+v, want %+v", mem, wantMem)
	}
	if mem, _ := sim.ProcessMemory(gpu1); len(mem) != 0 {
		t.Errorf("gpu1 after process 300 exited: %+v, want none", mem)
	}
	if got := post(http.MethodDelete, "/gpus/"+gpu0+"/processes/200"); got != http.StatusNoContent {
		t.Errorf("DELETE = %d", got)
	}
	if mem, _ := sim.ProcessMemory(gpu0); !reflect.DeepEqual(mem, []ProcessMemory{{PID: 100}, {PID: 200}}) {
		t.Errorf("after DELETE: %+v, want the container processes' unknown figures only", mem)
	}
}

// TestSimulatedHeldProcessKeepsItsShare: a container's process that a test gives memory but no
// SM figure is still reported within its share of the container's cores (e2e TestEnforcer's
// well-behaved neighbour, PID 80 % by its number alone, was reported over its 10 % before).
func TestSimulatedHeldProcessKeepsItsShare(t *testing.T) {
	sim := newTestSimulated(t, "dgx-h200", 1)
	sim.usage.now = func() uint64 { return 9_000_000 }
	uuid := mockDevice(sim, 0).UUID
	sim.usage.alive = func(int) bool { return true }
	const pid = 15 // 5 + (15 mod 19) × 5 = 80 % of its share
	sim.SetProcesses(func(string) []SimulatedProcess { return []SimulatedProcess{{PID: pid, CoreShare: 10}} })
	if err := sim.SetProcessUsage(uuid, pid, 900<<20, nil); err != nil {
		t.Fatal(err)
	}
	got, err := sim.ProcessUtilization(uuid, 0)
	if err != nil || len(got) != 1 || got[0].SMUtil != 8 {
		t.Errorf("ProcessUtilization = %+v, %v; want PID %d at 8 %% (80 %% of its 10 %% share)", got, err, pid)
	}
}
