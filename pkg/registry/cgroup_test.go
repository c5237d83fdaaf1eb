package registry

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestPodOfCgroup(t *testing.T) {
	const uid = "0b5a1c2d-3e4f-4a5b-8c6d-7e8f9a0b1c2d"
	const other = "1c6b2d3e-4f5a-4b6c-9d7e-8f9a0b1c2d3e"
	us := "0b5a1c2d_3e4f_4a5b_8c6d_7e8f9a0b1c2d"
	cases := []struct {
		cg, pod, container string
	}{
		{"/kubepods/besteffort/pod" + uid + "/abc", uid, "/kubepods/besteffort/pod" + uid + "/abc"},
		{"/kubepods/pod" + uid + "/abc/nested/deeper", uid, "/kubepods/pod" + uid + "/abc"},
		{"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + us + ".slice/cri-containerd-1.scope", uid, "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + us + ".slice/cri-containerd-1.scope"},
		{"/kubepods.slice/kubepods-pod" + us + ".slice/x", uid, "/kubepods.slice/kubepods-pod" + us + ".slice/x"},
		// The pod nearest the root wins: a container cannot nest a fake pod below itself.
		{"/kubepods/pod" + uid + "/ctr/pod" + other + "/x", uid, "/kubepods/pod" + uid + "/ctr"},
		{"/kubepods/pod" + uid, "", ""}, // the pod's own cgroup, no container
		{"/", "", ""},
		{"/user.slice/session-1.scope", "", ""},
		{"/kubepods/pod" + uid[:35] + "/x", "", ""},
		{"/kubepods/podXYZ/x", "", ""},
		{"/kubepods/pod" + "0B5A1C2D-3E4F-4A5B-8C6D-7E8F9A0B1C2D" + "/x", "", ""},
	}
	for _, c := range cases {
		pod, ctr, ok := PodOfCgroup(c.cg)
		if ok != (c.pod != "") || pod != c.pod || ctr != c.container {
			t.Errorf("PodOfCgroup(%q) = %q, %q, %v; want %q, %q", c.cg, pod, ctr, ok, c.pod, c.container)
		}
	}
}

func TestWithin(t *testing.T) {
	cases := []struct {
		cg, anc string
		want    bool
	}{
		{"/a/b", "/a/b", true},
		{"/a/b/c", "/a/b", true},
		{"/a/bc", "/a/b", false},
		{"/a", "/a/b", false},
		{"/x", "/", true},
		{"/a/b/../c", "/a/b", false},
		{"a/b", "a", false}, // relative paths are unknown
	}
	for _, c := range cases {
		if got := Within(c.cg, c.anc); got != c.want {
			t.Errorf("Within(%q, %q) = %v", c.cg, c.anc, got)
		}
	}
}

// fakeProc writes a proc tree with a mountinfo and /proc/<pid>/cgroup files.
func fakeProc(t *testing.T, mountinfo string, cgroups map[int]string) string {
	t.Helper()
	root := t.TempDir()
	for pid, content := range cgroups {
		d := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "cgroup"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "self", "mountinfo"), []byte(mountinfo), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

const hybridMountinfo = `30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
38 30 0:35 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`

const v2Mountinfo = `25 20 0:22 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate
`

func TestDetectCgroupHierarchy(t *testing.T) {
	cgroups := map[int]string{
		10: "9:name=systemd:/x\n8:pids:/kubepods/pod1/c\n0::/other\n",
		11: "8:cpu,pids:/joined\n",
		12: "0::/kubepods.slice/c.scope\n",
		13: "4:memory:/m\n",
		14: "0::/gone (deleted)\n",
	}
	h, err := DetectCgroupHierarchy(fakeProc(t, hybridMountinfo, cgroups))
	if err != nil || !h.V1Pids || h.Mount != "/sys/fs/cgroup/pids" || h.Root != "/" {
		t.Fatalf("hybrid: %+v, %v", h, err)
	}
	for pid, want := range map[int]string{10: "/kubepods/pod1/c", 11: "/joined", 12: "", 13: ""} {
		got, err := h.OfPID(pid)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("v1 OfPID(%d) = %q, %v; want %q", pid, got, err, want)
		}
	}
	if _, err := h.OfPID(99); err == nil {
		t.Error("a missing process has a cgroup")
	}

	h2, err := DetectCgroupHierarchy(fakeProc(t, v2Mountinfo, cgroups))
	if err != nil || h2.V1Pids || h2.Mount != "/sys/fs/cgroup" {
		t.Fatalf("v2: %+v, %v", h2, err)
	}
	for pid, want := range map[int]string{10: "/other", 12: "/kubepods.slice/c.scope", 13: "", 14: ""} {
		got, err := h2.OfPID(pid)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("v2 OfPID(%d) = %q, %v; want %q", pid, got, err, want)
		}
	}
	if _, err := DetectCgroupHierarchy(fakeProc(t, "1 0 0:1 / / rw - ext4 /dev/sda rw\n", nil)); err == nil {
		t.Error("no cgroup mount detected as one")
	}
}

func TestCgroupDirAndMountRoot(t *testing.T) {
	h := CgroupHierarchy{Mount: "/sys/fs/cgroup", Root: "/kubepods"}
	if d, err := h.Dir("/kubepods/pod1/c"); err != nil || d != "/sys/fs/cgroup/pod1/c" {
		t.Fatalf("Dir = %q, %v", d, err)
	}
	if _, err := h.Dir("/system.slice/x"); err == nil {
		t.Fatal("a cgroup outside the mount root has a directory")
	}
	if got := unescapeMountinfo(`/a\040b`); got != "/a b" {
		t.Fatal(got)
	}
}

func TestPIDsWalksDescendants(t *testing.T) {
	mount := t.TempDir()
	write := func(rel, content string) {
		d := filepath.Join(mount, rel)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("c", "30\n4\n")
	write("c/a", "7\n")
	write("c/a/deep", "30\n")
	write("c/b", "")
	write("other", "99\n")
	h := CgroupHierarchy{Mount: mount, Root: "/"}
	got, err := h.PIDs("/c")
	if err != nil || !slices.Equal(got, []int{4, 7, 30}) {
		t.Fatalf("PIDs = %v, %v", got, err)
	}
	if _, err := h.PIDs("/missing"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("a missing cgroup has PIDs")
	}
	write("bad", "x\n")
	if _, err := h.PIDs("/bad"); err == nil {
		t.Fatal("garbage in cgroup.procs accepted")
	}
}

func TestFreezerHierarchy(t *testing.T) {
	withFreezer := hybridMountinfo + "39 30 0:36 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer\n"
	proc := fakeProc(t, withFreezer, nil)
	h, err := DetectCgroupHierarchy(proc)
	if err != nil {
		t.Fatal(err)
	}
	f, v1, err := FreezerHierarchy(proc, h)
	if err != nil || !v1 || f.Mount != "/sys/fs/cgroup/freezer" || f.Root != "/" {
		t.Fatalf("hybrid: %+v v1=%v, %v; want the v1 freezer mount", f, v1, err)
	}
	if dir, err := f.Dir("/kubepods/pod1/c"); err != nil || dir != "/sys/fs/cgroup/freezer/kubepods/pod1/c" {
		t.Errorf("Dir = %q, %v", dir, err)
	}
	if _, _, err := FreezerHierarchy(fakeProc(t, hybridMountinfo, nil), h); err == nil || !strings.Contains(err.Error(), "no cgroup v1 freezer") {
		t.Errorf("v1 pids without a freezer: %v, want an error saying so", err)
	}
	v2proc := fakeProc(t, v2Mountinfo, nil)
	h2, err := DetectCgroupHierarchy(v2proc)
	if err != nil {
		t.Fatal(err)
	}
	if f, v1, err := FreezerHierarchy(v2proc, h2); err != nil || v1 || f != h2 {
		t.Errorf("v2: %+v v1=%v, %v; want the v2 hierarchy itself", f, v1, err)
	}
}
