//go:build chaos

package chaos

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// run records one fault's run: its injections, the invariant checks made and the violations
// found (each with its evidence), what users saw, and the figures that go into the summary.
type run struct {
	name  string
	start time.Time
	// causes are what an error a user sees during this fault may say (it names a cause).
	causes []*regexp.Regexp

	mu         sync.Mutex
	iterations int
	checks     int
	violations []string
	seen       map[string]bool // violation keys
	userErrors map[string]int  // "reason: message" (IDs masked) → how often
	notes      []string
	durations  map[string][]time.Duration // figure name → samples
	counts     map[string]int
	jobs       int
	pods       int
	runtimeGap int // inspections that could not reach containerd (it was down)
	// injecting is true until the fault's last injection has ended, at injected.
	injecting bool
	injected  time.Time
	// strayGrace, when set, is how long a vGPU container created without the plugin's
	// adjustment may run: the plugin stops it once it is back (fault.strayGrace).
	strayGrace time.Duration
}

// toleratesStrays says whether the fault lets the runtime create vGPU containers without the
// plugin's adjustment for a while.
func (r *run) toleratesStrays() bool { return r.strayGrace > 0 }

// deadline is when a pod created at created must run: runBound after its creation or after the
// fault's last injection, whichever is later; none while injections go on.
func (r *run) deadline(created time.Time) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.injecting {
		return time.Now().Add(runBound)
	}
	if r.injected.After(created) {
		return r.injected.Add(runBound)
	}
	return created.Add(runBound)
}

// injectionsDone marks the end of the fault's injections.
func (r *run) injectionsDone() {
	r.mu.Lock()
	r.injecting, r.injected = false, time.Now()
	r.mu.Unlock()
}

// check counts n invariant checks made.
func (r *run) check(n int) {
	r.mu.Lock()
	r.checks += n
	r.mu.Unlock()
}

// violate records a violation once per key, with its evidence.
func (r *run) violate(key, evidence string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seen = map[string]bool{}
	}
	if r.seen[key] {
		return
	}
	r.seen[key] = true
	r.violations = append(r.violations, fmt.Sprintf("%s [%s]: %s", key, time.Now().Format("15:04:05"), evidence))
}

func (r *run) violationList() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.violations)
}

// note adds a figure to the fault's line of the summary.
func (r *run) note(format string, args ...any) {
	r.mu.Lock()
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

// sample records one measured duration of a kind (summarised as median and maximum).
func (r *run) sample(kind string, d time.Duration) {
	r.mu.Lock()
	if r.durations == nil {
		r.durations = map[string][]time.Duration{}
	}
	r.durations[kind] = append(r.durations[kind], d)
	r.mu.Unlock()
}

// count adds one to a counter of a kind.
func (r *run) count(kind string) {
	r.mu.Lock()
	if r.counts == nil {
		r.counts = map[string]int{}
	}
	r.counts[kind]++
	r.mu.Unlock()
}

var (
	uidPattern = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	idPattern  = regexp.MustCompile(`[0-9a-f]{64}`)
	jobPattern = regexp.MustCompile(`\b([a-z]+)-\d+(-[ab])?\b`)
	pidPattern = regexp.MustCompile(`\[\d+\]`) // libvgpu: error[<pid>]
)

// sawUserError records an error a user sees: an event or a container's waiting message.
func (r *run) sawUserError(reason, message string) {
	masked := uidPattern.ReplaceAllString(message, "<uid>")
	masked = idPattern.ReplaceAllString(masked, "<id>")
	masked = jobPattern.ReplaceAllString(masked, "$1-<n>$2")
	masked = pidPattern.ReplaceAllString(masked, "[<pid>]")
	r.mu.Lock()
	if r.userErrors == nil {
		r.userErrors = map[string]int{}
	}
	r.userErrors[reason+": "+masked]++
	r.mu.Unlock()
}

// checkUserErrors turns every error a user saw that names none of the fault's causes into a
// violation, and notes how many of each kind there were.
func (r *run) checkUserErrors() {
	r.mu.Lock()
	errs := make([]string, 0, len(r.userErrors))
	for e := range r.userErrors {
		errs = append(errs, e)
	}
	counts := r.userErrors
	r.mu.Unlock()
	sort.Strings(errs)
	r.check(len(errs))
	total, unnamed := 0, 0
	for _, e := range errs {
		total += counts[e]
		if !slices.ContainsFunc(r.causes, func(re *regexp.Regexp) bool { return re.MatchString(e) }) {
			unnamed++
			r.violate("an error users see names no cause", fmt.Sprintf("%q (%d times)", e, counts[e]))
		}
	}
	switch {
	case total == 0:
	case unnamed == 0:
		r.note("user-visible errors %d (%d kinds, each naming its cause)", total, len(errs))
	default:
		r.note("user-visible errors %d (%d kinds, %d naming no cause)", total, len(errs), unnamed)
	}
}

// row is the fault's line of the summary.
func (r *run) row() row {
	r.mu.Lock()
	defer r.mu.Unlock()
	var figs []string
	figs = append(figs, fmt.Sprintf("jobs %d (pods %d)", r.jobs, r.pods))
	for _, kind := range slices.Sorted(maps.Keys(r.durations)) {
		figs = append(figs, fmt.Sprintf("%s %s", kind, spread(r.durations[kind])))
	}
	for _, kind := range slices.Sorted(maps.Keys(r.counts)) {
		figs = append(figs, fmt.Sprintf("%s %d", kind, r.counts[kind]))
	}
	if r.runtimeGap > 0 {
		figs = append(figs, fmt.Sprintf("containerd unreachable for %d inspections", r.runtimeGap))
	}
	figs = append(figs, r.notes...)
	return row{fault: r.name, iterations: r.iterations, checks: r.checks, violations: len(r.violations), figures: figs, violated: slices.Clone(r.violations)}
}

// spread is "median / max" of the samples.
func spread(d []time.Duration) string {
	s := slices.Clone(d)
	slices.Sort(s)
	return fmt.Sprintf("p50 %.1fs max %.1fs (n=%d)", s[len(s)/2].Seconds(), s[len(s)-1].Seconds(), len(s))
}

// row is one line of the summary table.
type row struct {
	fault      string
	iterations int
	checks     int
	violations int
	figures    []string
	violated   []string // the violations, in words
}

// maxViolationText bounds each violation as the summary repeats it: CI shows the end of the
// output, and the summary's last lines must say what failed.
const maxViolationText = 400

// summaryText is the summary table: one line per fault, figures wrapped below it.
func summaryText(rows []row) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-22s %10s %10s %10s  %s\n", "fault", "iterations", "checks", "violations", "figures")
	for _, r := range rows {
		first := ""
		if len(r.figures) > 0 {
			first = r.figures[0]
		}
		fmt.Fprintf(&b, "%-22s %10d %10d %10d  %s\n", r.fault, r.iterations, r.checks, r.violations, first)
		for _, f := range r.figures[min(1, len(r.figures)):] {
			fmt.Fprintf(&b, "%-22s %10s %10s %10s  %s\n", "", "", "", "", f)
		}
	}
	for _, r := range rows {
		for _, v := range r.violated {
			if len(v) > maxViolationText {
				v = v[:maxViolationText] + "…"
			}
			fmt.Fprintf(&b, "VIOLATION %s: %s\n", r.fault, v)
		}
	}
	return b.String()
}
