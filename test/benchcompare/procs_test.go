//go:build benchcompare

package benchcompare

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// proc is a process the benchmark started: stopped by PID (SIGTERM, then SIGKILL) at cleanup
// or by stop. Each is recorded as "PID EXE" in $VGPU_BENCH_PIDS, so that hack/bench-compare.sh
// kills what a benchmark killed before its cleanup left. (Not Pdeathsig: the kernel sends it
// when the thread that started the child ends, and Go ends threads at will.)
type proc struct {
	name string
	cmd  *exec.Cmd
	log  *bytes.Buffer
	done chan struct{}
}

func startProc(b *testing.B, name, exe string, env []string, args ...string) *proc {
	b.Helper()
	p := &proc{name: name, cmd: exec.Command(exe, args...), log: &bytes.Buffer{}, done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		b.Fatalf("start %s: %v", name, err)
	}
	if pids := os.Getenv("VGPU_BENCH_PIDS"); pids != "" {
		f, err := os.OpenFile(pids, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		_, err = fmt.Fprintf(f, "%d %s\n", p.cmd.Process.Pid, exe)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	b.Cleanup(p.stop)
	return p
}

// stop sends SIGTERM and waits up to 10 s, then SIGKILL; a process already gone is fine.
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// tail is the end of the process's output, for a failure message.
func (p *proc) tail() string {
	s := p.log.String()
	if len(s) > 4000 {
		s = s[len(s)-4000:]
	}
	return s
}

// procStats are what /proc says of a process at one moment.
type procStats struct {
	rssKiB, hwmKiB   int64   // VmRSS, VmHWM
	anonKiB, fileKiB int64   // RssAnon (heap, stacks), RssFile (the executable's pages)
	threads          int64   // Threads
	cpu              float64 // utime + stime, seconds
}

func (p *proc) stats(b *testing.B) procStats {
	b.Helper()
	pid := p.cmd.Process.Pid
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatalf("%s: %v", p.name, err)
	}
	var st procStats
	for _, line := range strings.Split(string(status), "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.Fields(val + " 0")[0], 10, 64)
		switch key {
		case "VmRSS":
			st.rssKiB = n
		case "VmHWM":
			st.hwmKiB = n
		case "RssAnon":
			st.anonKiB = n
		case "RssFile":
			st.fileKiB = n
		case "Threads":
			st.threads = n
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatalf("%s: %v", p.name, err)
	}
	// Fields after the command name (which may hold spaces), from field 3: utime is field 14,
	// stime 15, in clock ticks (100 per second on Linux).
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	st.cpu = (utime + stime) / 100
	return st
}
