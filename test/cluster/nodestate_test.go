package cluster

import (
	"encoding/json"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
)

const (
	claimX = "0f6c2a8e-4b1d-4c3a-9e2f-7a5b6c8d9e01"
	claimY = "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"
	podP   = "9d8c7b6a-5f4e-4d3c-2b1a-0f9e8d7c6b5a"
)

// kubeletFile writes a DRA checkpoint the way the kubelet does: JSON data as a string, with the
// CRC-32 of that string.
func kubeletFile(t *testing.T, data string) string {
	t.Helper()
	b, err := json.Marshal(struct {
		Data     string
		Checksum uint32
	}{data, crc32.ChecksumIEEE([]byte(data))})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dra_manager_state")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReadKubeletDRAState(t *testing.T) {
	data := `{"kind":"DRACheckpoint","apiVersion":"checkpoint.dra.kubelet.k8s.io/v1","ClaimInfoStateList":[
	 {"ClaimUID":"` + claimX + `","ClaimName":"a","Namespace":"ns","PodUIDs":{"` + podP + `":{}},
	  "DriverState":{"vgpu.dra.dev":{"Devices":[{"PoolName":"node","DeviceName":"gpu-0","RequestNames":["gpu"],"CDIDeviceIDs":["vgpu.dra.dev/claim=b","vgpu.dra.dev/claim=a"]}]}}},
	 {"ClaimUID":"` + claimY + `","ClaimName":"b","Namespace":"ns","PodUIDs":{"` + podP + `":{}},
	  "DriverState":{"vgpu.dra.dev":{}}},
	 {"ClaimUID":"2b2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d","ClaimName":"c","Namespace":"ns","PodUIDs":{},
	  "DriverState":{"other.example.com":{"Devices":[{"CDIDeviceIDs":["x"]}]}}}]}`
	got, err := ReadKubeletDRAState(kubeletFile(t, data))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]KubeletClaim{
		claimX: {UID: claimX, Namespace: "ns", Name: "a", PodUIDs: []string{podP}, Prepared: true,
			CDIDeviceIDs: []string{"vgpu.dra.dev/claim=a", "vgpu.dra.dev/claim=b"}},
		claimY: {UID: claimY, Namespace: "ns", Name: "b", PodUIDs: []string{podP}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}

	// A damaged file is an error, never an empty state.
	path := kubeletFile(t, data)
	b, _ := os.ReadFile(path)
	if err := os.WriteFile(path, []byte(strings.Replace(string(b), `\"a\"`, `\"z\"`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadKubeletDRAState(path); err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Errorf("damaged file: %v, want a checksum error", err)
	}
}

func TestDisagreements(t *testing.T) {
	completed := func(ns, name, share string, ids ...string) checkpoint.Claim {
		return checkpoint.Claim{Namespace: ns, Name: name, State: checkpoint.PrepareCompleted,
			Devices: []checkpoint.Device{{Pool: "node", Device: "gpu-0", ShareID: share, CDIDeviceIDs: ids}}}
	}
	prepared := func(uid, name string, ids ...string) KubeletClaim {
		return KubeletClaim{UID: uid, Namespace: "ns", Name: name, Prepared: true, CDIDeviceIDs: ids}
	}
	for _, tc := range []struct {
		name    string
		plugin  map[string]checkpoint.Claim
		kubelet map[string]KubeletClaim
		want    []string // substrings, one disagreement each
	}{
		{"agree", map[string]checkpoint.Claim{claimX: completed("ns", "a", "s1", "d1", "d2")},
			map[string]KubeletClaim{claimX: prepared(claimX, "a", "d1", "d2")}, nil},
		{"in flux: asked, not yet answered", map[string]checkpoint.Claim{claimX: {Namespace: "ns", Name: "a", State: checkpoint.PrepareStarted}},
			map[string]KubeletClaim{claimX: {UID: claimX, Namespace: "ns", Name: "a"}}, nil},
		{"leaked", map[string]checkpoint.Claim{claimX: completed("ns", "a", "s1")}, nil,
			[]string{"unknown to the kubelet"}},
		{"lost", nil, map[string]KubeletClaim{claimX: prepared(claimX, "a")},
			[]string{"missing from the plugin's checkpoint"}},
		{"not completed", map[string]checkpoint.Claim{claimX: {Namespace: "ns", Name: "a", State: checkpoint.PrepareStarted}},
			map[string]KubeletClaim{claimX: prepared(claimX, "a")}, []string{"prepared for the kubelet but PrepareStarted"}},
		{"other CDI devices", map[string]checkpoint.Claim{claimX: completed("ns", "a", "s1", "d1")},
			map[string]KubeletClaim{claimX: prepared(claimX, "a", "d2")}, []string{"CDI devices [d2]"}},
		{"duplicated name", map[string]checkpoint.Claim{claimX: completed("ns", "a", "s1"), claimY: completed("ns", "a", "s2")},
			map[string]KubeletClaim{claimX: prepared(claimX, "a"), claimY: prepared(claimY, "a")},
			[]string{"in the plugin's checkpoint twice", "in the kubelet's DRA state twice"}},
		{"duplicated share", map[string]checkpoint.Claim{claimX: completed("ns", "a", "s1"), claimY: completed("ns", "b", "s1")},
			map[string]KubeletClaim{claimX: prepared(claimX, "a"), claimY: prepared(claimY, "b")},
			[]string{"share node/gpu-0/s1 is in claims"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Disagreements(checkpoint.Data{Claims: tc.plugin}, tc.kubelet)
			if len(got) != len(tc.want) {
				t.Fatalf("disagreements %q, want %d", got, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("disagreement %q does not say %q", got[i], w)
				}
			}
		})
	}
}
