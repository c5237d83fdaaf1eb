package cluster

import (
	"strings"
	"testing"
)

func TestVGPUProblems(t *testing.T) {
	const (
		state = "/var/lib/vgpu-dra"
		claim = "c1a2b3c4-d5e6-4f70-8192-a3b4c5d6e7f8"
		podA  = "0b7a2c6e-1f7e-4c9e-9d2a-3f1e5b6c7d8e"
		podB  = "1b7a2c6e-1f7e-4c9e-9d2a-3f1e5b6c7d8e"
	)
	dirOf := func(pod, name string) string { return state + "/claims/" + claim + "/" + pod + "_" + name }
	vgpu := func(id, pod, name, dir string) Container {
		return Container{
			ID: id + "0000000000000000", Namespace: "ns", Pod: "p-" + id, PodUID: pod, Name: name,
			Env: map[string]string{"MANAGER_VGPU_CLAIM_UID": claim, "VGPU_POD_UID": pod, "VGPU_CONTAINER_NAME": name},
			Mounts: map[string]string{
				"/etc/vgpu-dra/config": dir + "/config", "/tmp/.vgpu_lock": dir + "/vgpu_lock", "/tmp/.vmem_node": dir + "/vmem_node",
			},
		}
	}
	good := vgpu("a", podA, "app", dirOf(podA, "app"))
	plain := Container{ID: "plain000000000000", Env: map[string]string{"PATH": "/bin"}, Mounts: map[string]string{}}

	noMount := vgpu("b", podB, "app", dirOf(podB, "app"))
	delete(noMount.Mounts, "/tmp/.vmem_node")
	noIdentity := vgpu("b", podB, "app", dirOf(podB, "app"))
	noIdentity.Env["VGPU_POD_UID"] = ""
	wrongName := vgpu("b", podB, "app", dirOf(podB, "app"))
	wrongName.Env["VGPU_CONTAINER_NAME"] = "other"
	others := vgpu("b", podB, "app", dirOf(podA, "app")) // pod B running with pod A's directories
	twice := vgpu("b", podB, "app", dirOf(podB, "app"))  // adjusted by two plugin instances
	twice.Repeated = []string{"/tmp/.vgpu_lock"}

	stray := Container{ID: "stray00000000000", Env: map[string]string{"MANAGER_VGPU_CLAIM_UID": claim}, Mounts: map[string]string{}}
	for _, tc := range []struct {
		c    Container
		want bool
	}{{stray, true}, {good, false}, {noMount, false}, {noIdentity, false}, {plain, false}} {
		if got := Unadjusted(tc.c); got != tc.want {
			t.Errorf("Unadjusted(%s) = %v, want %v", tc.c.ID, got, tc.want)
		}
	}

	for _, tc := range []struct {
		name string
		list []Container
		want []string // substrings, one problem line each; none when empty
	}{
		{"complete", []Container{good, plain}, nil},
		{"not a vGPU container", []Container{plain}, nil},
		{"mount missing", []Container{good, noMount}, []string{"no mount at /tmp/.vmem_node"}},
		{"identity missing", []Container{noIdentity}, []string{`VGPU_POD_UID=""`}},
		{"identity of another name", []Container{wrongName}, []string{`VGPU_CONTAINER_NAME="other"`}},
		{"a mount listed twice", []Container{good, twice}, []string{"/tmp/.vgpu_lock mounted twice"}},
		{"another container's directories", []Container{good, others}, []string{"not its own", "shares " + dirOf(podA, "app") + "/config with ns/p-a/app"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := VGPUProblems(tc.list, state)
			if len(tc.want) == 0 {
				if len(got) > 0 {
					t.Fatalf("problems %q, want none", got)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("problems %q, want one line with %q", got, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(got[0], w) {
					t.Errorf("problem %q does not say %q", got[0], w)
				}
			}
		})
	}
}
