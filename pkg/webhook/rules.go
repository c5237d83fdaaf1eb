package webhook

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// Reasons for a refusal (label "reason" of webhook_denials_total, contract §8 and §12).
const (
	ReasonTwoClaims         = "two_claims"
	ReasonNoDistinctUUID    = "no_distinct_uuid"
	ReasonContractEnv       = "contract_env"
	ReasonCapacity          = "capacity"
	ReasonMissingClaim      = "missing_claim"
	ReasonInvalidAnnotation = "invalid_annotation"
	ReasonContainerName     = "container_name"
	ReasonMalformedObject   = "malformed_object"
)

// Violation is one rule a pod or claim breaks: why (a Reason*) and the message for the user.
type Violation struct {
	Reason  string
	Message string
}

// podRules checks the pod's vGPU containers (contract §12): each uses one vGPU claim, several
// vGPU requests of it only under a distinctAttribute constraint on the GPU's UUID, and sets no
// variable of the contract. uuidAttribute is "<driver>/uuid".
func podRules(uses []containerUse, uuidAttribute string) []Violation {
	var out []Violation
	for _, u := range uses {
		if len(u.claims) > 1 {
			names := make([]string, len(u.claims))
			for i, c := range u.claims {
				names[i] = c.String()
			}
			out = append(out, Violation{ReasonTwoClaims, fmt.Sprintf(
				"%s uses %d vGPU claims, %s: a container may hold one vGPU claim, because CDI would let one claim's "+
					"limits silently replace the other's; put the requests into one claim with a constraint "+
					"{distinctAttribute: %q} over them, or give each claim its own container",
				u.describe(), len(u.claims), strings.Join(names, " and "), uuidAttribute)})
		}
		for _, c := range u.claims {
			if v, ok := distinctRule(u, c, uuidAttribute); !ok {
				out = append(out, v)
			}
		}
		if env := contractEnv(u.container); len(env) > 0 {
			out = append(out, Violation{ReasonContractEnv, fmt.Sprintf(
				"%s uses a vGPU and sets %s in its env: vgpu-dra sets these variables itself (the container's limits "+
					"and identity), and a value from the pod spec would be taken for its own; remove them from the "+
					"container's env", u.describe(), strings.Join(env, ", "))})
		}
	}
	return out
}

// distinctRule checks that the vGPU requests a container gets from one claim can never put two
// results on one GPU (contract §3): one request for one device, or a distinctAttribute
// constraint on the UUID that covers them all. The extended resource's claim is exempt: the
// scheduler makes it, with whole GPUs, which never share one.
func distinctRule(u containerUse, c claimUse, uuidAttribute string) (Violation, bool) {
	if c.spec == nil {
		return Violation{}, true
	}
	var several []string
	results := 0
	for _, r := range c.requests {
		n, what := devicesAsked(r)
		results += n
		several = append(several, fmt.Sprintf("%q%s", r.Name, what))
	}
	if results <= 1 || distinctCovers(c.spec.Devices.Constraints, c.requests, uuidAttribute) {
		return Violation{}, true
	}
	return Violation{ReasonNoDistinctUUID, fmt.Sprintf(
		"%s gets vGPU request(s) %s of %s without a constraint {distinctAttribute: %q} over them: two of their devices "+
			"could be shares of one GPU, and CDI would let one's limits silently replace the other's; add to the "+
			"claim's spec.devices.constraints: {requests: [%s], distinctAttribute: %q}",
		u.describe(), strings.Join(several, ", "), c, uuidAttribute,
		strings.Join(quoteAll(c.requestNames()), ", "), uuidAttribute)}, false
}

// devicesAsked says how many devices a request can get (2 stands for "more than one") and how
// to say so in a message.
func devicesAsked(r resourceapi.DeviceRequest) (int, string) {
	count := func(mode resourceapi.DeviceAllocationMode, n int64) (int, string) {
		switch {
		case mode == resourceapi.DeviceAllocationModeAll:
			return 2, " (all matching devices)"
		case n > 1:
			return 2, fmt.Sprintf(" (%d devices)", n)
		}
		return 1, ""
	}
	if r.Exactly != nil {
		return count(r.Exactly.AllocationMode, r.Exactly.Count)
	}
	most, what := 1, ""
	for _, s := range r.FirstAvailable {
		if n, w := count(s.AllocationMode, s.Count); n > most {
			most, what = n, fmt.Sprintf(" (subrequest %q:%s)", s.Name, w)
		}
	}
	return most, what
}

// distinctCovers reports whether one distinctAttribute constraint on the UUID applies to every
// one of the requests: it lists no requests (it applies to all) or lists each of them, by its
// name or by the name of each of its subrequests.
func distinctCovers(constraints []resourceapi.DeviceConstraint, requests []resourceapi.DeviceRequest, uuidAttribute string) bool {
	for _, c := range constraints {
		if c.DistinctAttribute == nil || string(*c.DistinctAttribute) != uuidAttribute {
			continue
		}
		if len(c.Requests) == 0 || !slices.ContainsFunc(requests, func(r resourceapi.DeviceRequest) bool {
			return !constraintCovers(c.Requests, r)
		}) {
			return true
		}
	}
	return false
}

// constraintCovers reports whether a constraint's request list covers the request.
func constraintCovers(list []string, r resourceapi.DeviceRequest) bool {
	if slices.Contains(list, r.Name) {
		return true
	}
	if len(r.FirstAvailable) == 0 {
		return false
	}
	for _, s := range r.FirstAvailable {
		if !slices.Contains(list, r.Name+"/"+s.Name) {
			return false
		}
	}
	return true
}

// contractEnv lists the variables of the contract that the container's env sets.
func contractEnv(c *corev1.Container) []string {
	var out []string
	for _, e := range c.Env {
		if contract.IsContractEnv(e.Name) && !slices.Contains(out, e.Name) {
			out = append(out, e.Name)
		}
	}
	return out
}

// claimRules checks the capacity that a claim's requests for our classes ask for against the
// request policy every GPU is published with (contract §2), and its configuration for our
// driver (config.go, contract §17). object names the claim or template; configPath is where its
// config list is.
func claimRules(spec *resourceapi.ResourceClaimSpec, sel Selection, object string, configPath *field.Path) []Violation {
	out := configRules(spec, sel, object, configPath)
	for _, r := range spec.Devices.Requests {
		if r.Exactly != nil && sel.isOurClass(r.Exactly.DeviceClassName) {
			out = append(out, capacityRules(r.Exactly.Capacity, fmt.Sprintf("%s: request %q", object, r.Name))...)
		}
		for _, s := range r.FirstAvailable {
			if sel.isOurClass(s.DeviceClassName) {
				out = append(out, capacityRules(s.Capacity, fmt.Sprintf("%s: request %q", object, r.Name+"/"+s.Name))...)
			}
		}
	}
	return out
}

// capacityRules checks one request's memory and cores. The scheduler rounds a request up to
// the policy's next valid value and fails only one above the maximum; a request that it would
// round is refused too, so that what a claim says is what its container gets.
func capacityRules(c *resourceapi.CapacityRequirements, request string) []Violation {
	if c == nil {
		return nil
	}
	var out []Violation
	if q, ok := c.Requests[contract.CapacityMemory]; ok {
		if msg := memoryProblem(q); msg != "" {
			out = append(out, Violation{ReasonCapacity, fmt.Sprintf("%s asks for memory %s, %s", request, q.String(), msg)})
		}
	}
	if q, ok := c.Requests[contract.CapacityCores]; ok {
		if msg := coresProblem(q); msg != "" {
			out = append(out, Violation{ReasonCapacity, fmt.Sprintf("%s asks for cores %s, %s", request, q.String(), msg)})
		}
	}
	return out
}

func memoryProblem(q resource.Quantity) string {
	minimum := resource.NewQuantity(contract.MemoryMinimum, resource.BinarySI)
	if q.Cmp(*minimum) < 0 {
		return fmt.Sprintf("below the smallest vGPU share of %s (the scheduler would silently round it up); ask for %s or more",
			minimum, minimum)
	}
	v, exact := q.AsInt64()
	if !exact || v%contract.MemoryStep != 0 {
		up := q.Value() // rounds up to a whole byte
		up = (up + contract.MemoryStep - 1) / contract.MemoryStep * contract.MemoryStep
		return fmt.Sprintf("not a whole number of Mi (the scheduler would silently round it up to %s); ask for a multiple of 1Mi",
			resource.NewQuantity(up, resource.BinarySI))
	}
	return ""
}

func coresProblem(q resource.Quantity) string {
	v, exact := q.AsInt64()
	switch {
	case q.Cmp(*resource.NewQuantity(contract.CoresTotal, resource.DecimalSI)) > 0:
		return fmt.Sprintf("but cores are a percentage of one GPU's compute, at most %d: no GPU can satisfy it", contract.CoresTotal)
	case !exact || v < contract.CoresMinimum:
		return fmt.Sprintf("but cores are a whole percentage of one GPU's compute, from %d to %d (the scheduler would "+
			"silently round it up); ask for a whole number in that range", contract.CoresMinimum, contract.CoresTotal)
	}
	return ""
}
