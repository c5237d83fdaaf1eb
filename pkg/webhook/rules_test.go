package webhook

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
)

// specsForRules: claims for the collision rules.
var specsForRules = fakeSpecs{claims: map[string]*resourceapi.ResourceClaimSpec{
	"ns/one":  spec([]resourceapi.DeviceRequest{request("gpu", testClass, 1, "1Gi", "10")}),
	"ns/one2": spec([]resourceapi.DeviceRequest{request("gpu", testClass, 1, "1Gi", "10")}),
	"ns/nic":  spec([]resourceapi.DeviceRequest{request("nic", otherClass, 1, "", "")}),
	"ns/two": spec([]resourceapi.DeviceRequest{
		request("a", testClass, 1, "1Gi", "10"), request("b", testClass, 1, "1Gi", "10")}),
	"ns/two-distinct": spec([]resourceapi.DeviceRequest{
		request("a", testClass, 1, "1Gi", "10"), request("b", testClass, 1, "1Gi", "10")},
		distinct(testUUID, "a", "b")),
	"ns/two-distinct-all": spec([]resourceapi.DeviceRequest{
		request("a", testClass, 1, "1Gi", "10"), request("b", testClass, 1, "1Gi", "10")},
		distinct(testUUID)),
	"ns/two-distinct-other-attr": spec([]resourceapi.DeviceRequest{
		request("a", testClass, 1, "1Gi", "10"), request("b", testClass, 1, "1Gi", "10")},
		distinct("vgpu.dra.dev/index", "a", "b")),
	"ns/two-distinct-partial": spec([]resourceapi.DeviceRequest{
		request("a", testClass, 1, "1Gi", "10"), request("b", testClass, 1, "1Gi", "10"), request("c", testClass, 1, "1Gi", "10")},
		distinct(testUUID, "a", "b")),
	"ns/count2":          spec([]resourceapi.DeviceRequest{request("gpu", testClass, 2, "1Gi", "10")}),
	"ns/count2-distinct": spec([]resourceapi.DeviceRequest{request("gpu", testClass, 2, "1Gi", "10")}, distinct(testUUID, "gpu")),
	"ns/all": spec([]resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: testClass, AllocationMode: resourceapi.DeviceAllocationModeAll}}}),
	"ns/sub-count2": spec([]resourceapi.DeviceRequest{firstAvailable("gpu", subrequest("pair", testClass, 2, "1Gi"), subrequest("one", testClass, 1, "1Gi"))}),
	"ns/sub-count2-distinct": spec([]resourceapi.DeviceRequest{firstAvailable("gpu", subrequest("pair", testClass, 2, "1Gi"), subrequest("one", testClass, 1, "1Gi"))},
		distinct(testUUID, "gpu/pair", "gpu/one")),
	"ns/gpu-and-nic": spec([]resourceapi.DeviceRequest{request("gpu", testClass, 1, "1Gi", "10"), request("nic", otherClass, 2, "", "")}),
}}

// TestPodRules: each pod rule (contract §12) refuses what it must, with a message that names the
// container, claim and request, and admits its near misses.
func TestPodRules(t *testing.T) {
	claims := func(names ...string) []corev1.PodResourceClaim {
		var out []corev1.PodResourceClaim
		for _, n := range names {
			out = append(out, podClaim(n, n, false))
		}
		return out
	}
	tests := []struct {
		name   string
		pod    *corev1.Pod
		reason string   // empty: admitted
		msg    []string // substrings of the message
	}{
		// Two vGPU claims in one container.
		{name: "two vGPU claims", pod: pod(claims("one", "one2"), container("app", "one", "one2")), reason: ReasonTwoClaims,
			msg: []string{`container "app" uses 2 vGPU claims`, `pod claim "one" (ResourceClaim "ns/one")`, `pod claim "one2"`, `{distinctAttribute: "vgpu.dra.dev/uuid"}`}},
		{name: "a claim and the extended resource", pod: pod(claims("one"), withExtended(container("app", "one"), 1)), reason: ReasonTwoClaims,
			msg: []string{`the extended resource "vgpu.dra.dev/vgpu"`}},
		{name: "init container with two vGPU claims", pod: withInit(pod(claims("one", "one2"), container("app")), container("setup", "one", "one2")),
			reason: ReasonTwoClaims, msg: []string{`init container "setup" uses 2 vGPU claims`}},
		{name: "negative: a vGPU claim and another driver's claim", pod: pod(claims("one", "nic"), container("app", "one", "nic"))},
		{name: "negative: two containers, one vGPU claim each", pod: pod(claims("one", "one2"), container("a", "one"), container("b", "one2"))},
		{name: "negative: one claim referenced twice", pod: pod(claims("two-distinct"), container("app", "two-distinct/a", "two-distinct/b"))},

		// Several vGPU requests without a distinctAttribute constraint on the UUID.
		{name: "two requests", pod: pod(claims("two"), container("app", "two")), reason: ReasonNoDistinctUUID,
			msg: []string{`container "app" gets vGPU request(s) "a", "b" of pod claim "two" (ResourceClaim "ns/two")`, `{requests: ["a", "b"], distinctAttribute: "vgpu.dra.dev/uuid"}`}},
		{name: "two requests referenced one by one", pod: pod(claims("two"), container("app", "two/a", "two/b")), reason: ReasonNoDistinctUUID},
		{name: "constraint on another attribute", pod: pod(claims("two-distinct-other-attr"), container("app", "two-distinct-other-attr")), reason: ReasonNoDistinctUUID},
		{name: "constraint that leaves one request out", pod: pod(claims("two-distinct-partial"), container("app", "two-distinct-partial")), reason: ReasonNoDistinctUUID},
		{name: "count 2", pod: pod(claims("count2"), container("app", "count2")), reason: ReasonNoDistinctUUID, msg: []string{`"gpu" (2 devices)`}},
		{name: "allocation mode All", pod: pod(claims("all"), container("app", "all")), reason: ReasonNoDistinctUUID, msg: []string{"(all matching devices)"}},
		{name: "subrequest for 2", pod: pod(claims("sub-count2"), container("app", "sub-count2")), reason: ReasonNoDistinctUUID, msg: []string{`subrequest "pair"`}},
		{name: "negative: constraint over both", pod: pod(claims("two-distinct"), container("app", "two-distinct"))},
		{name: "negative: constraint over all requests", pod: pod(claims("two-distinct-all"), container("app", "two-distinct-all"))},
		{name: "negative: count 2 under a constraint", pod: pod(claims("count2-distinct"), container("app", "count2-distinct"))},
		{name: "negative: subrequests each named in the constraint", pod: pod(claims("sub-count2-distinct"), container("app", "sub-count2-distinct"))},
		{name: "negative: one request of two", pod: pod(claims("two"), container("app", "two/a"), container("b", "two/b"))},
		{name: "negative: one vGPU request next to another class's", pod: pod(claims("gpu-and-nic"), container("app", "gpu-and-nic"))},
		{name: "negative: two whole GPUs by extended resource", pod: pod(nil, withExtended(container("app"), 2))},

		// Contract variables in the env of a vGPU container.
		{name: "claim UID in the env", pod: pod(claims("one"), withEnv(container("app", "one"), "MANAGER_VGPU_CLAIM_UID", "PATH")), reason: ReasonContractEnv,
			msg: []string{`container "app" uses a vGPU and sets MANAGER_VGPU_CLAIM_UID in its env`}},
		{name: "limits and identity in the env", pod: pod(nil, withEnv(withExtended(container("app"), 1), "CUDA_MEM_LIMIT_0", "CUDA_CORE_LIMIT", "VGPU_POD_UID", "VGPU_CONTAINER_NAME")),
			reason: ReasonContractEnv, msg: []string{"CUDA_MEM_LIMIT_0, CUDA_CORE_LIMIT, VGPU_POD_UID, VGPU_CONTAINER_NAME"}},
		{name: "negative: contract env in a container without a vGPU", pod: pod(claims("one"), container("app", "one"), withEnv(container("side"), "MANAGER_VGPU_CLAIM_UID"))},
		{name: "negative: other env in a vGPU container", pod: pod(claims("one"), withEnv(container("app", "one"), "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			uses, err := podUses(context.Background(), specsForRules, testSelection, "ns", tt.pod)
			if err != nil {
				t.Fatal(err)
			}
			got := podRules(uses, testUUID)
			checkViolations(t, got, tt.reason, tt.msg)
		})
	}
}

// TestClaimRules: capacity requests for our class outside the published request policy
// (contract §2) are refused, naming the object and request; those inside it, and requests of
// other classes, are not.
func TestClaimRules(t *testing.T) {
	one := func(memory, cores string) *resourceapi.ResourceClaimSpec {
		return spec([]resourceapi.DeviceRequest{request("gpu", testClass, 1, memory, cores)})
	}
	tests := []struct {
		name   string
		spec   *resourceapi.ResourceClaimSpec
		reason string
		msg    []string
	}{
		{name: "memory below the minimum", spec: one("100Mi", ""), reason: ReasonCapacity,
			msg: []string{`ResourceClaim "ns/c": request "gpu" asks for memory 100Mi, below the smallest vGPU share of 256Mi`, "ask for 256Mi or more"}},
		{name: "memory not a whole number of Mi", spec: one("1000000000", ""), reason: ReasonCapacity,
			msg: []string{"memory 1G", "round it up to 954Mi", "multiple of 1Mi"}},
		{name: "negative: memory in whole Mi", spec: one("300Mi", "")},
		{name: "cores 0", spec: one("", "0"), reason: ReasonCapacity, msg: []string{"cores 0", "from 1 to 100"}},
		{name: "cores above 100", spec: one("", "101"), reason: ReasonCapacity, msg: []string{"cores 101", "no GPU can satisfy it"}},
		{name: "fractional cores", spec: one("", "30.5"), reason: ReasonCapacity, msg: []string{"whole percentage"}},
		{name: "fractional cores above 100", spec: one("", "100.5"), reason: ReasonCapacity, msg: []string{"no GPU can satisfy it"}},
		{name: "subrequest of our class", spec: spec([]resourceapi.DeviceRequest{firstAvailable("gpu", subrequest("small", testClass, 1, "1Ki"))}),
			reason: ReasonCapacity, msg: []string{`request "gpu/small" asks for memory 1Ki`}},
		{name: "negative: the minimum", spec: one("256Mi", "1")},
		{name: "negative: whole GPU by numbers", spec: one("141Gi", "100")},
		{name: "negative: no capacity (the whole GPU)", spec: one("", "")},
		{name: "negative: another class", spec: spec([]resourceapi.DeviceRequest{request("nic", otherClass, 1, "1", "500")})},
		{name: "negative: another class's subrequest", spec: spec([]resourceapi.DeviceRequest{firstAvailable("gpu", subrequest("x", otherClass, 1, "1"), subrequest("y", testClass, 1, "1Gi"))})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkViolations(t, claimRules(tt.spec, testSelection, `ResourceClaim "ns/c"`, claimConfigPath), tt.reason, tt.msg)
		})
	}
}

// checkViolations: no violation when reason is empty; else exactly the one reason, with every
// substring in its message.
func checkViolations(t *testing.T, got []Violation, reason string, msg []string) {
	t.Helper()
	if reason == "" {
		if len(got) > 0 {
			t.Errorf("refused: %+v", got)
		}
		return
	}
	if len(got) == 0 {
		t.Fatalf("admitted, want a %s refusal", reason)
	}
	for _, v := range got {
		if v.Reason != reason {
			t.Errorf("reason %s (%s), want %s", v.Reason, v.Message, reason)
		}
	}
	for _, want := range msg {
		if !strings.Contains(got[0].Message, want) {
			t.Errorf("message %q lacks %q", got[0].Message, want)
		}
	}
}
