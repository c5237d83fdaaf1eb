package clusterview

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestPrintGPUs(t *testing.T) {
	gpus, err := Reader{Client: cluster(), Driver: driver}.GPUs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct{ output, want string }{
		{OutputTable, `
NODE     DEVICE   MEMORY   ALLOCATED   FREE    CORES   CORES-ALLOCATED   CORES-FREE   SHARES   HEALTH
node-a   gpu-0    141Gi    30Gi        111Gi   100%    55%               45%          2        Healthy
node-a   gpu-1    141Gi    0           141Gi   100%    0%                100%         0        Unhealthy: XID-79
node-b   gpu-0    141Gi    141Gi       0       100%    100%              0%           1        Healthy
`},
		{OutputWide, `
NODE     DEVICE   MEMORY   ALLOCATED   FREE    CORES   CORES-ALLOCATED   CORES-FREE   SHARES   HEALTH              UUID     PRODUCT                   CLAIMS
node-a   gpu-0    141Gi    30Gi        111Gi   100%    55%               45%          2        Healthy             GPU-a0   NVIDIA H200 141GB HBM3e   team/share-a,team/share-b-xyz(BestEffort,100%)
node-a   gpu-1    141Gi    0           141Gi   100%    0%                100%         0        Unhealthy: XID-79   GPU-a1   NVIDIA H200 141GB HBM3e   <none>
node-b   gpu-0    141Gi    141Gi       0       100%    100%              0%           1        Healthy             GPU-b0   NVIDIA H200 141GB HBM3e   batch/whole
`},
	}
	for _, tc := range tests {
		t.Run("output="+tc.output, func(t *testing.T) {
			var out bytes.Buffer
			if err := PrintGPUs(&out, gpus, tc.output); err != nil {
				t.Fatal(err)
			}
			if got := out.String(); got != strings.TrimPrefix(tc.want, "\n") {
				t.Errorf("printed\n%s\nwant\n%s", got, strings.TrimPrefix(tc.want, "\n"))
			}
		})
	}
	// -o json: a list scripts can decode back into this package's types, numbers in bytes.
	var out bytes.Buffer
	if err := PrintGPUs(&out, gpus, OutputJSON); err != nil {
		t.Fatal(err)
	}
	var list struct {
		APIVersion, Kind string
		Items            []GPU
	}
	if err := json.Unmarshal(out.Bytes(), &list); err != nil {
		t.Fatalf("decode -o json: %v\n%s", err, out.String())
	}
	if list.APIVersion != APIVersion || list.Kind != KindGPUs || !reflect.DeepEqual(list.Items, gpus) {
		t.Errorf("-o json decodes to %s %s %+v, want %+v", list.APIVersion, list.Kind, list.Items, gpus)
	}
}

func TestPrintPods(t *testing.T) {
	shares, err := Reader{Client: cluster(), Driver: driver}.Pods(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		output        string
		withNamespace bool
		want          string
	}{
		{OutputTable, false, `
POD       CLAIM         NODE     DEVICE   MEMORY   CORES   CLASS        CEILING
trainer   whole         node-b   gpu-0    141Gi    100%    <none>       <none>
share-a   share-a       node-a   gpu-0    10Gi     30%     Guaranteed   -
share-b   share-b-xyz   node-a   gpu-0    20Gi     25%     BestEffort   100%
`},
		{OutputWide, true, `
NAMESPACE   POD       CLAIM         NODE     DEVICE   MEMORY   CORES   CLASS        CEILING   REQUEST   UUID     CONTAINERS
batch       trainer   whole         node-b   gpu-0    141Gi    100%    <none>       <none>    gpu       GPU-b0   train
team        share-a   share-a       node-a   gpu-0    10Gi     30%     Guaranteed   -         gpu       GPU-a0   app
team        share-b   share-b-xyz   node-a   gpu-0    20Gi     25%     BestEffort   100%      gpu       GPU-a0   app,helper
`},
	}
	for _, tc := range tests {
		t.Run("output="+tc.output, func(t *testing.T) {
			var out bytes.Buffer
			if err := PrintPods(&out, shares, tc.output, tc.withNamespace); err != nil {
				t.Fatal(err)
			}
			if got := out.String(); got != strings.TrimPrefix(tc.want, "\n") {
				t.Errorf("printed\n%s\nwant\n%s", got, strings.TrimPrefix(tc.want, "\n"))
			}
		})
	}
	var out bytes.Buffer
	if err := PrintPods(&out, shares, OutputJSON, false); err != nil {
		t.Fatal(err)
	}
	var list struct{ Items []PodShare }
	if err := json.Unmarshal(out.Bytes(), &list); err != nil || !reflect.DeepEqual(list.Items, shares) {
		t.Errorf("-o json decodes to %+v (%v), want %+v", list.Items, err, shares)
	}
	// The names a script reads: the device status's own (contract §3).
	var raw struct{ Items []map[string]any }
	if err := json.Unmarshal(out.Bytes(), &raw); err != nil || len(raw.Items) != 3 {
		t.Fatalf("-o json: %v, %d items", err, len(raw.Items))
	}
	for i, want := range []map[string]any{{}, {"class": "Guaranteed"}, {"class": "BestEffort", "coresCeiling": float64(100)}} {
		got := map[string]any{}
		for _, k := range []string{"class", "coresCeiling"} {
			if v, ok := raw.Items[i][k]; ok {
				got[k] = v
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("-o json item %d (%s) has %v, want %v", i, raw.Items[i]["pod"], got, want)
		}
	}
}

func TestCheckOutput(t *testing.T) {
	for output, ok := range map[string]bool{"": true, "wide": true, "json": true, "yaml": false, "name": false} {
		if err := CheckOutput(output); (err == nil) != ok {
			t.Errorf("CheckOutput(%q) = %v", output, err)
		}
	}
}
