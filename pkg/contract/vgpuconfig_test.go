package contract

import (
	"reflect"
	"strconv"
	"strings"
	"testing"
)

const (
	testClaim = "0f6c2a8e-4b1d-4c3a-9e2f-7a5b6c8d9e01"
	testPod   = "9d8c7b6a-5f4e-4d3c-ab1a-0f9e8d7c6b5a"
	testGPU   = "GPU-11111111-2222-3333-4444-555555555555"
)

func TestContainerConfigRoundTrip(t *testing.T) {
	for _, c := range []ContainerConfig{
		{ClaimUID: testClaim, PodUID: testPod, ContainerName: "app", GPUs: []ContainerGPU{
			{Index: 0, UUID: testGPU, MemoryBytes: 4 << 30, Cores: 30},
			{Index: 17, UUID: "GPU-2", MemoryBytes: 0, Cores: 0},
		}},
		{ClaimUID: testClaim, RegisterUUID: testPod, GPUs: []ContainerGPU{{Index: 3, UUID: testGPU, MemoryBytes: 1 << 20, Cores: 100}}},
		{ClaimUID: testClaim}, // admin access: no GPU limited
	} {
		got, err := ParseContainerConfig(c.Encode())
		if err != nil {
			t.Fatalf("parse of %q: %v", c.Encode(), err)
		}
		if !reflect.DeepEqual(got, c) {
			t.Errorf("round trip: got %+v, want %+v", got, c)
		}
	}
	want := "version 1\nclaim " + testClaim + "\npod " + testPod + "\ncontainer app\ngpu 0 " + testGPU + " 4294967296 30\n"
	c := ContainerConfig{ClaimUID: testClaim, PodUID: testPod, ContainerName: "app", GPUs: []ContainerGPU{{Index: 0, UUID: testGPU, MemoryBytes: 4 << 30, Cores: 30}}}
	if got := string(c.Encode()); !strings.HasSuffix(got, want) {
		t.Errorf("Encode = %q, want it to end with %q (the format the library parses)", got, want)
	}
}

// TestParseContainerConfigRefuses: what the library refuses, the Go reader refuses, naming the
// line; unknown keys are skipped (forward-compatible additions within version 1).
func TestParseContainerConfigRefuses(t *testing.T) {
	gpu := "gpu 0 " + testGPU + " 1048576 30\n"
	tests := map[string]string{
		"":                                                                  "no version line",
		"claim " + testClaim + "\n":                                         "first line must be",
		"version 2\n":                                                       `version "2"`,
		"version 1\nversion 1\n":                                            "second version line",
		"version 1\n" + gpu + gpu:                                           "appears twice",
		"version 1\ngpu 0 " + testGPU + " 1 30":                             "newline",
		"version 1\ngpu -1 GPU-1 0 0\n":                                     "index",
		"version 1\ngpu 01 GPU-1 0 0\n":                                     "index",
		"version 1\ngpu 0 GPU-1 -5 0\n":                                     "memory limit",
		"version 1\ngpu 0 GPU-1 1k 0\n":                                     "memory limit",
		"version 1\ngpu 0 GPU-1 0 101\n":                                    "core limit",
		"version 1\ngpu 0 GPU-1 0\n":                                        "gpu takes",
		"version 1\npod " + testPod + "\n":                                  "go together",
		"version 1\npod ../x\ncontainer a\n":                                "pod UID",
		"version 1\ncontainer A\npod " + testPod + "\n":                     "container name",
		"version 1\ngpu 0  GPU-1 0 0\n":                                     "exactly one space",
		"version 1\ngpu 0 GPU-1 0 0 \n":                                     "exactly one space",
		"version 1\nclaim\t" + testClaim + "\n":                             "control",
		"version 1\ngpu 2147483648 GPU-1 0 0\n":                             "index",
		"version 1\ngpu 0 GPU-a 0 0\ngpu 1 gpu-A 0 0\n":                     "appears twice",
		"version 1\n#" + strings.Repeat("x", ContainerConfigMaxLine) + "\n": "longer than",
		"version 1\nclaim " + testClaim + "\nclaim " + testClaim + "\n":     "appears twice",
	}
	for in, want := range tests {
		_, err := ParseContainerConfig([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err = %v, want one mentioning %q", in, err, want)
		}
	}
	var b strings.Builder
	b.WriteString("version 1\n")
	for i := 0; i <= ContainerConfigMaxGPUs; i++ {
		b.WriteString("gpu " + strconv.Itoa(i) + " GPU-" + strconv.Itoa(i) + " 0 0\n")
	}
	if _, err := ParseContainerConfig([]byte(b.String())); err == nil || !strings.Contains(err.Error(), "more than 16") {
		t.Errorf("17 GPUs: %v, want refused", err)
	}
	if c, err := ParseContainerConfig([]byte("version 1\nfuture-key anything at all\n" + gpu)); err != nil || len(c.GPUs) != 1 {
		t.Errorf("unknown key: %+v, %v; want skipped", c, err)
	}
	big := "version 1\n#" + strings.Repeat("x", ContainerConfigMaxBytes) + "\n"
	if _, err := ParseContainerConfig([]byte(big)); err == nil {
		t.Error("a file over the size bound was accepted")
	}
}

// FuzzParseContainerConfig: the reader never panics, and what it accepts encodes back to a file
// it reads the same way.
func FuzzParseContainerConfig(f *testing.F) {
	f.Add([]byte("version 1\nclaim " + testClaim + "\npod " + testPod + "\ncontainer app\ngpu 0 " + testGPU + " 4294967296 30\n"))
	f.Add([]byte("version 1\nregister " + testPod + "\ngpu 17 G 0 0\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseContainerConfig(data)
		if err != nil {
			return
		}
		again, err := ParseContainerConfig(c.Encode())
		if err != nil || !reflect.DeepEqual(again, c) {
			t.Fatalf("accepted %q, but its encoding %q reads back as %+v, %v", data, c.Encode(), again, err)
		}
	})
}
