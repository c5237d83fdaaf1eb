//go:build escape

package escape

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vgpu-dra/vgpu-dra/pkg/enforce"
)

// Verdicts: who stopped the technique.
const (
	// byLibrary: libvgpu.so refused the allocations past the claim; the GPU never showed the
	// container above its limit.
	byLibrary = "library: refused at the limit"
	// byEnforcer: the container went over its limit on the GPU and the node's enforcer killed
	// its processes within the bound.
	byEnforcer = "enforcer: killed"
	// byMount: the technique's first step failed on a read-only mount (EROFS, EBUSY), and the
	// library then held the tenant to its claim.
	byMount = "read-only mount, then the library"
	// bySlack: the container holds more than its limit but within the documented slack per
	// process (contract §15): the residual the threat model states, bounded.
	bySlack = "residual: within the per-process slack"
	// byConfigMount: the library refused a vgpu.config that is not on the node's read-only
	// mount of the config directory (cuInit = CUDA_ERROR_NOT_PERMITTED): the tenant got nothing.
	byConfigMount = "library: refused the forged vgpu.config (not the node's read-only mount)"
)

const (
	limitMiB = 1024
	// wantMiB is what a tenant asks for: past its limit plus one process's slack.
	wantMiB = 3072
	// hold: how long a tenant keeps what it got; the enforcer's bound (grace plus a period,
	// 1 s by default) is well inside it.
	hold = 4
	// reactionBound is what a test accepts between the first sample over the bound and the
	// container back under it: the enforcer's 1 s plus the harness's sampling and a loaded
	// machine's scheduling. make bench measures the reaction itself.
	reactionBound = 3 * time.Second
)

type technique struct {
	id, what string
	// script runs with /bin/sh as root in the sandbox; {pod} is the sandbox's pod UID.
	script string
	want   string
	// readOnlyRoot: the container's root file system is read-only (the webhook's
	// require-readonly-root policy).
	readOnlyRoot bool
	// refused: the output must contain REFUSED (the step that needs a writable path failed).
	refused bool
}

// tenant is the command line of one tenant process asking for mib through route and api.
func tenant(route, api string, mib int) string {
	return fmt.Sprintf(`tenant %s %s %d %d; echo "exit $?"`, route, api, mib, hold)
}

const (
	// renameAway moves the directory that holds every mount point of the library away: rename
	// refuses a mount point (EBUSY) but not its parent, a directory of the container's rootfs.
	renameAway = `mv /etc/vgpu-dra /etc/x && echo renamed || echo REFUSED; `
	// forgeLibrary puts a copy of the library where /etc/ld.so.preload points, with a
	// configuration of the tenant's own: the container's identity, no limits.
	forgeLibrary = `mkdir -p /etc/vgpu-dra/lib /etc/vgpu-dra/config && cp /etc/x/lib/libvgpu.so /etc/vgpu-dra/lib/ && ` +
		`printf 'version 1\npod {pod}\ncontainer app\ngpu 0 ` + gpuUUID + ` 0 0\n' > /etc/vgpu-dra/config/vgpu.config && ` +
		`ln -s /etc/x/config/pids.config /etc/vgpu-dra/config/pids.config; `
	// forgeVolume: the forged configuration in /opt/volume, a read-only mount the sandbox
	// fills with it (as a ConfigMap volume the tenant wrote through the API would be), and the
	// config directory a symlink to it.
	forgeVolume = `mkdir -p /etc/vgpu-dra/lib && cp /etc/x/lib/libvgpu.so /etc/vgpu-dra/lib/ && ln -s /opt/volume /etc/vgpu-dra/config && ` +
		`ln -s /etc/x/registry /etc/vgpu-dra/registry; `
)

var techniques = []technique{
	{id: "dlsym", what: "allocate through dlsym on the driver's handle", script: tenant("dlsym", "v2", wantMiB), want: byLibrary},
	{id: "rtld-default", what: "dlsym(RTLD_DEFAULT)", script: tenant("default", "v2", wantMiB), want: byLibrary},
	{id: "rtld-next", what: "dlsym(RTLD_NEXT)", script: tenant("next", "v2", wantMiB), want: byLibrary},
	{id: "procaddr", what: "cuGetProcAddress_v2, CUDA 12.0, default flags", script: tenant("procaddr:12000:0", "v2", wantMiB), want: byLibrary},
	{id: "procaddr-old", what: "cuGetProcAddress_v2 with an old version (3020)", script: tenant("procaddr:3020:0", "v2", wantMiB), want: byLibrary},
	{id: "procaddr-ptsz", what: "cuGetProcAddress_v2 with per-thread-stream flags", script: tenant("procaddr:12000:2", "v2", wantMiB), want: byLibrary},
	{id: "procaddr-odd", what: "cuGetProcAddress_v2 with a future version and unknown flags", script: tenant("procaddr:99999:7", "v2", wantMiB), want: byLibrary},
	{id: "api-v1", what: "the 32-bit cuMemAlloc", script: tenant("dlsym", "v1", wantMiB), want: byLibrary},
	{id: "api-pitch", what: "cuMemAllocPitch_v2", script: tenant("dlsym", "pitch", wantMiB), want: byLibrary},
	{id: "api-managed", what: "cuMemAllocManaged", script: tenant("dlsym", "managed", wantMiB), want: byLibrary},
	{id: "api-async", what: "stream-ordered cuMemAllocAsync", script: tenant("dlsym", "async", wantMiB), want: byLibrary},
	{id: "api-pool", what: "cuMemAllocFromPoolAsync", script: tenant("dlsym", "pool", wantMiB), want: byLibrary},
	{id: "api-vmm", what: "VMM cuMemCreate", script: tenant("dlsym", "vmm", wantMiB), want: byLibrary},
	{id: "env-cleared", what: "run with an empty environment (env -i)", script: `env -i LD_LIBRARY_PATH="$LD_LIBRARY_PATH" FAKE_GPU_STATE="$FAKE_GPU_STATE" FAKE_GPU_DEVICES="$FAKE_GPU_DEVICES" PATH="$PATH" ` + tenant("dlsym", "v2", wantMiB), want: byLibrary},
	{id: "fork-children", what: "two processes of one container, each asking for 900 MiB", script: `tenant dlsym v2 900 ` + fmt.Sprint(hold) + ` & ` + tenant("dlsym", "v2", 900) + `; wait`, want: byLibrary},
	{id: "many-processes", what: "four processes at once, 900 MiB each", script: `for i in 1 2 3; do tenant dlsym v2 900 ` + fmt.Sprint(hold) + ` & done; ` + tenant("dlsym", "v2", 900) + `; wait`, want: byLibrary},
	{id: "preload-rewrite", what: "empty /etc/ld.so.preload", script: `printf '' > /etc/ld.so.preload && echo wrote || echo REFUSED; ` + tenant("dlsym", "v2", wantMiB), want: byMount, refused: true},
	{id: "preload-rename", what: "rename /etc/ld.so.preload away", script: `mv /etc/ld.so.preload /etc/p && echo moved || echo REFUSED; ` + tenant("dlsym", "v2", wantMiB), want: byMount, refused: true},
	{id: "config-rewrite", what: "rewrite vgpu.config in place", script: `echo 'version 1' > /etc/vgpu-dra/config/vgpu.config && echo wrote || echo REFUSED; ` + tenant("dlsym", "v2", wantMiB), want: byMount, refused: true},
	{id: "lib-rename", what: "rename the library's mount point (the file)", script: `mv /etc/vgpu-dra/lib/libvgpu.so /etc/vgpu-dra/lib/x.so && echo moved || echo REFUSED; ` + tenant("dlsym", "v2", wantMiB), want: byMount, refused: true},
	{id: "lib-dir-rename", what: "rename the directory that holds the library's mount point", script: `mv /etc/vgpu-dra/lib /etc/vgpu-dra/l && echo moved || echo REFUSED; ` + tenant("dlsym", "v2", wantMiB), want: byEnforcer},
	{id: "dlvsym-libc-dlsym", what: "libc's own dlsym through dlvsym(libc, \"dlsym\", \"GLIBC_2.34\")", script: tenant("dlvsym", "v2", wantMiB), want: byEnforcer},
	{id: "dlmopen", what: "the driver loaded again with dlmopen(LM_ID_NEWLM), its entry points through dlsym", script: tenant("dlmopen", "v2", wantMiB), want: byLibrary},
	{id: "dynsym-walk", what: "the driver's .dynsym walked from dl_iterate_phdr", script: tenant("dynsym", "v2", wantMiB), want: byEnforcer},
	{id: "real-procaddr", what: "the driver's own cuGetProcAddress_v2, found by a .dynsym walk", script: tenant("realprocaddr", "v2", wantMiB), want: byEnforcer},
	{id: "dynsym-vmm", what: "VMM cuMemCreate from the driver's .dynsym", script: tenant("dynsym", "vmm", wantMiB), want: byEnforcer},
	{id: "rename-etc-vgpu-dra", what: "mv /etc/vgpu-dra /etc/x: ld.so ignores the preload", script: renameAway + tenant("dlsym", "v2", wantMiB), want: byEnforcer},
	{id: "rename-etc", what: "mv /etc /etc.real and a fresh /etc without ld.so.preload", script: `mv /etc /etc.real && mkdir /etc && echo renamed || echo REFUSED; ` + tenant("dlsym", "v2", wantMiB), want: byEnforcer},
	{id: "forged-config", what: "the rename, a copy of the library and a forged vgpu.config without limits, the real registry linked back", script: renameAway + forgeLibrary + `ln -s /etc/x/registry /etc/vgpu-dra/registry; ` + tenant("dlsym", "v2", wantMiB), want: byConfigMount},
	{id: "forged-no-registry", what: "the rename and a forged vgpu.config, no registry socket", script: renameAway + forgeLibrary + tenant("dlsym", "v2", wantMiB), want: byConfigMount},
	{id: "forged-config-symlink", what: "the rename, a copy of the library and a symlink from the config directory to a read-only directory the tenant filled (a ConfigMap volume's kind)", script: renameAway + forgeVolume + tenant("dlsym", "v2", wantMiB), want: byConfigMount},
	{id: "ledger-truncate", what: "truncate the shared ledger while a process holds 900 MiB, then allocate 900 MiB more", script: `tenant dlsym v2 900 ` + fmt.Sprint(hold+1) + ` & sleep 1; : > /tmp/.vmem_node/ledger.v2; ` + tenant("dlsym", "v2", 900) + `; wait`, want: byLibrary},
	{id: "ledger-precreate", what: "a forged ledger file created before the first process", script: `head -c 65536 /dev/zero | tr '\0' '\377' > /tmp/.vmem_node/ledger.v2; ` + tenant("dlsym", "v2", wantMiB), want: byLibrary},
	{id: "bypass-unregistered", what: "three processes around the library, 600 MiB each, never registered", script: `for i in 1 2; do tenant dynsym v2 600 ` + fmt.Sprint(hold) + ` & done; ` + tenant("dynsym", "v2", 600) + `; wait`, want: byEnforcer},
	{id: "bypass-under-slack", what: "three processes that register through the hooks and then allocate around them, 600 MiB each (under one process's slack)", script: `for i in 1 2; do tenant registered-dynsym v2 600 ` + fmt.Sprint(hold) + ` & done; ` + tenant("registered-dynsym", "v2", 600) + `; wait`, want: bySlack},
	{id: "ro-root-rename", what: "read-only root file system (require-readonly-root): mv /etc/vgpu-dra", script: renameAway + tenant("dlsym", "v2", wantMiB), want: byMount, readOnlyRoot: true, refused: true},
	{id: "ro-root-etc", what: "read-only root file system: mv /etc", script: `mv /etc /etc.real && echo renamed || echo REFUSED; ` + tenant("dlsym", "v2", wantMiB), want: byMount, readOnlyRoot: true, refused: true},
}

// result is what one technique got.
type result struct {
	technique
	verdict     string
	peakMiB     uint64
	overFor     time.Duration // from the first sample over the bound to the last
	reactions   []time.Duration
	maxExcessPP uint64 // the largest excess over the limit per process, MiB
}

var (
	resultsMu sync.Mutex
	results   []result
)

func TestEscape(t *testing.T) {
	resultsMu.Lock()
	results = nil // -count=N: each run's table is its own
	resultsMu.Unlock()
	for _, tc := range techniques {
		t.Run(tc.id, func(t *testing.T) {
			r := runTechnique(t, tc)
			resultsMu.Lock()
			results = append(results, r)
			resultsMu.Unlock()
		})
	}
	t.Run("verdict-table", func(t *testing.T) { checkVerdictTable(t) })
}

func runTechnique(t *testing.T, tc technique) result {
	n := theNode
	s := newSandbox(t, n, tc.id, limitMiB, tc.readOnlyRoot)
	defer n.remove(s)
	_, before := n.rec.snapshot()
	script := strings.ReplaceAll(tc.script, "{pod}", s.podUID)

	// Sample the GPU as the enforcer does, for as long as the technique runs.
	slack := uint64(enforce.DefaultSlackPerProcess)
	var (
		mu                  sync.Mutex
		peak, maxExcessPP   uint64
		firstOver, lastOver time.Time
	)
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			sum, procs := n.usage(s)
			now := time.Now()
			mu.Lock()
			peak = max(peak, sum)
			if procs > 0 && sum > s.limit {
				maxExcessPP = max(maxExcessPP, (sum-s.limit)/uint64(procs)>>20)
			}
			if sum > s.limit+slack*uint64(procs) {
				if firstOver.IsZero() {
					firstOver = now
				}
				lastOver = now
			}
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	out := s.run(t, n, script, 30*time.Second)
	close(stop)
	<-sampled
	t.Logf("%s:\n%s", tc.what, out)
	if strings.Contains(out, "[sandbox exit") || !strings.Contains(out, "cuInit = ") {
		t.Errorf("the sandbox failed or the tenant never started: the technique was not tried")
	}

	r := result{technique: tc, peakMiB: peak >> 20, maxExcessPP: maxExcessPP, reactions: n.rec.reactionsSince(before)}
	if !firstOver.IsZero() {
		r.overFor = lastOver.Sub(firstOver)
	}
	killed := strings.Contains(out, "exit 137")
	switch {
	case !firstOver.IsZero() && (!killed || r.overFor > reactionBound):
		r.verdict = fmt.Sprintf("ESCAPED: held %d MiB of a %d MiB claim for %v", r.peakMiB, limitMiB, r.overFor.Round(time.Millisecond))
	case killed: // only the enforcer kills here; over the limit or unregistered
		r.verdict = byEnforcer
	case peak > s.limit:
		r.verdict = bySlack
	case strings.Contains(out, "cuInit = 800") && strings.Contains(out, "not the node's"):
		r.verdict = byConfigMount
	case tc.refused:
		r.verdict = byMount
	default:
		r.verdict = byLibrary
	}
	if tc.refused && !strings.Contains(out, "REFUSED") {
		t.Errorf("the technique's first step was not refused:\n%s", out)
	}
	if r.verdict != tc.want {
		t.Errorf("verdict %q, want %q (peak %d MiB, over the bound for %v, killed %v)", r.verdict, tc.want, r.peakMiB, r.overFor, killed)
	}
	if r.verdict == byEnforcer {
		t.Logf("enforcer: over the bound for %v as the harness sampled it; reactions %v", r.overFor.Round(time.Millisecond), r.reactions)
	}
	// Nothing of the container's may stay on the GPU once its processes are gone.
	deadline := time.Now().Add(5 * time.Second)
	for {
		sum, _ := n.usage(s)
		if sum == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%d MiB still held after the technique ended", sum>>20)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return r
}

// containsMountUnder reports whether mountinfo lists a mount point at or below dir.
func containsMountUnder(mountinfo, dir string) bool {
	for _, line := range strings.Split(mountinfo, "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			return true
		}
	}
	return false
}

// sortedResults returns the results in the techniques' order.
func sortedResults() []result {
	resultsMu.Lock()
	defer resultsMu.Unlock()
	out := slices.Clone(results)
	order := map[string]int{}
	for i, tc := range techniques {
		order[tc.id] = i
	}
	slices.SortFunc(out, func(a, b result) int { return order[a.id] - order[b.id] })
	return out
}
