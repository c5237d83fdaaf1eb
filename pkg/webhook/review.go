package webhook

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/vgpu-dra/vgpu-dra/pkg/metrics"
)

// Paths the webhook configurations call (contract §12).
const (
	PathMutatePods             = "/mutate/pods"
	PathValidatePods           = "/validate/pods"
	PathValidateClaims         = "/validate/resourceclaims"
	PathValidateClaimTemplates = "/validate/resourceclaimtemplates"
	PathValidateDeviceClasses  = "/validate/deviceclasses"
)

// maxReviewBytes bounds a request body: an object is at most ~1.5 MiB in etcd, and a review
// of an UPDATE carries two.
const maxReviewBytes = 8 << 20

// Rules is what the reviews apply: which devices are ours, the attribute a distinctAttribute
// constraint must name, and the NRI plugin containers must require.
type Rules struct {
	Selection
	// Driver is the DRA driver name ("vgpu.dra.dev"): no DeviceClass but ours may select it.
	Driver string
	// UUIDAttribute is the GPU UUID attribute qualified with the driver name ("vgpu.dra.dev/uuid").
	UUIDAttribute string
	// RequiredPlugin is the NRI plugin name the annotation requires (the driver name); empty when
	// the kubelet plugin runs without NRI: no annotation then (nothing would register it).
	RequiredPlugin string
	// ContainerPolicy is what a vGPU container must be (policy.go); PolicyAudit when empty.
	ContainerPolicy ContainerPolicy
	// RefuseToolkitEnv refuses NVIDIA_VISIBLE_DEVICES and its kin in the env of every
	// unprivileged container of a pod (toolkitenv.go).
	RefuseToolkitEnv bool
}

// Reviewer answers the AdmissionReviews of the webhooks.
type Reviewer struct {
	rules   Rules
	specs   Specs
	pods    Pods
	metrics *metrics.WebhookMetrics
}

// NewReviewer returns a Reviewer that looks claims up in specs, the pods a new claim is for in
// pods (nil: a new claim is not checked against them), and counts in m.
func NewReviewer(rules Rules, specs Specs, pods Pods, m *metrics.WebhookMetrics) *Reviewer {
	return &Reviewer{rules: rules, specs: specs, pods: pods, metrics: m}
}

// outcome is what a review decided.
type outcome struct {
	patch      []patchOperation
	violations []Violation
	// warnings are returned to the client with an admitted object (kubectl prints them).
	warnings []string
	// err is a failure of the review itself (not a rule): the request is refused with it.
	err error
}

// review decides about one request of a known kind.
type review func(ctx context.Context, req *admissionv1.AdmissionRequest) outcome

// route is one webhook path: what it reviews and how, on CREATE and on UPDATE (nil: admitted
// unchecked).
type route struct {
	path, webhook, kind string
	create, update      review
}

// Handler serves the webhook paths.
func (r *Reviewer) Handler(ctx context.Context) http.Handler {
	mux := http.NewServeMux()
	for _, rt := range []route{
		{PathMutatePods, metrics.WebhookMutating, "Pod", r.mutatePod, nil},
		{PathValidatePods, metrics.WebhookValidating, "Pod", r.validatePod, r.updatePod},
		{PathValidateClaims, metrics.WebhookValidating, "ResourceClaim", r.validateClaim, nil},
		{PathValidateClaimTemplates, metrics.WebhookValidating, "ResourceClaimTemplate", r.validateTemplate, nil},
		{PathValidateDeviceClasses, metrics.WebhookValidating, "DeviceClass", r.validateDeviceClass, r.validateDeviceClass},
	} {
		logger := klog.FromContext(ctx).WithValues("webhook", rt.webhook, "kind", rt.kind)
		mux.HandleFunc("POST "+rt.path, func(w http.ResponseWriter, req *http.Request) {
			r.serve(klog.NewContext(req.Context(), logger), w, req, rt)
		})
	}
	return mux
}

// serve reads one AdmissionReview, runs the review, and writes the answer.
func (r *Reviewer) serve(ctx context.Context, w http.ResponseWriter, httpReq *http.Request, rt route) {
	webhook, kind := rt.webhook, rt.kind
	start := time.Now()
	logger := klog.FromContext(ctx)
	body, err := io.ReadAll(http.MaxBytesReader(w, httpReq.Body, maxReviewBytes))
	var in admissionv1.AdmissionReview
	if err == nil {
		err = json.Unmarshal(body, &in)
	}
	if err == nil && in.Request == nil {
		err = errors.New("the AdmissionReview has no request")
	}
	if err != nil {
		r.metrics.Admissions.WithLabelValues(webhook, kind, metrics.DecisionError).Inc()
		logger.Error(err, "Unreadable admission review")
		http.Error(w, "read AdmissionReview: "+err.Error(), http.StatusBadRequest)
		return
	}
	req := in.Request
	logger = logger.WithValues("object", klog.KRef(req.Namespace, req.Name), "operation", req.Operation, "uid", req.UID)
	ctx = klog.NewContext(ctx, logger)

	var out outcome
	switch {
	case req.Kind.Kind != kind:
		out.err = fmt.Errorf("this webhook reviews %s objects, not %s: check the webhook configuration's rules", kind, req.Kind.Kind)
	case req.Operation == admissionv1.Create:
		out = rt.create(ctx, req)
	case req.Operation == admissionv1.Update && rt.update != nil:
		// A pod's annotations, and its ephemeral containers, change after creation (updatePod).
		out = rt.update(ctx, req)
	default:
		// The rest of what the rules look at is immutable after creation (pod spec claims,
		// env; claim and template specs): nothing to check on other operations.
	}
	resp, decision := r.respond(req, out)
	r.metrics.Admissions.WithLabelValues(webhook, kind, decision).Inc()
	r.metrics.Duration.WithLabelValues(webhook, kind).Observe(time.Since(start).Seconds())
	switch decision {
	case metrics.DecisionDenied:
		logger.Info("Refused", "reasons", reasons(out.violations), "message", resp.Result.Message)
	case metrics.DecisionError:
		logger.Error(out.err, "Review failed; the API server refuses the object")
	case metrics.DecisionPatched:
		logger.V(2).Info("Added the required-plugins annotation", "patch", out.patch)
	default:
		logger.V(5).Info("Admitted")
	}
	in.Request, in.Response = nil, resp
	b, err := json.Marshal(in)
	if err != nil {
		logger.Error(err, "Encode the admission response")
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if _, err := w.Write(b); err != nil {
		logger.V(2).Info("Write the admission response", "err", err)
	}
}

// respond turns an outcome into the AdmissionResponse and the decision label.
func (r *Reviewer) respond(req *admissionv1.AdmissionRequest, out outcome) (*admissionv1.AdmissionResponse, string) {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true, Warnings: out.warnings}
	switch {
	case out.err != nil:
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusInternalServerError,
			Reason: metav1.StatusReasonInternalError, Message: "vgpu-webhook could not review the object: " + out.err.Error()}
		return resp, metrics.DecisionError
	case len(out.violations) > 0:
		msgs := make([]string, len(out.violations))
		for i, v := range out.violations {
			msgs[i] = v.Message
			r.metrics.Denials.WithLabelValues(v.Reason).Inc()
		}
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden,
			Reason: metav1.StatusReasonForbidden, Message: strings.Join(msgs, "; ")}
		return resp, metrics.DecisionDenied
	case len(out.patch) > 0:
		b, err := json.Marshal(out.patch)
		if err != nil {
			return r.respond(req, outcome{err: fmt.Errorf("encode the patch: %w", err)})
		}
		pt := admissionv1.PatchTypeJSONPatch
		resp.Patch, resp.PatchType = b, &pt
		return resp, metrics.DecisionPatched
	}
	return resp, metrics.DecisionAllowed
}

// mutatePod adds the required-plugins annotation to the pod's vGPU containers.
func (r *Reviewer) mutatePod(ctx context.Context, req *admissionv1.AdmissionRequest) outcome {
	pod, uses, out := r.decodePodUses(ctx, req)
	if out != nil {
		return *out
	}
	set, err := requiredPluginsAnnotations(pod, uses, r.rules.RequiredPlugin)
	var ae *annotationError
	var ne *containerNameError
	switch {
	case errors.As(err, &ae):
		return outcome{violations: []Violation{{ReasonInvalidAnnotation, ae.Error()}}}
	case errors.As(err, &ne):
		return outcome{violations: []Violation{{ReasonContainerName, ne.Error()}}}
	}
	if err != nil {
		return outcome{err: err}
	}
	return outcome{patch: annotationPatch(pod, set)}
}

// validatePod applies the pod rules to the pod's vGPU containers.
func (r *Reviewer) validatePod(ctx context.Context, req *admissionv1.AdmissionRequest) outcome {
	pod, uses, out := r.decodePodUses(ctx, req)
	if out != nil {
		return *out
	}
	policy := cmp.Or(r.rules.ContainerPolicy, PolicyAudit)
	var env []Violation
	if r.rules.RefuseToolkitEnv {
		env = toolkitEnvRules(pod)
	}
	if req.SubResource == "ephemeralcontainers" {
		refusals, warnings := ephemeralRules(policy, pod, uses)
		return outcome{violations: append(refusals, env...), warnings: warnings}
	}
	refusals, warnings := policyRules(policy, pod, uses)
	return outcome{violations: slices.Concat(podRules(uses, r.rules.UUIDAttribute), refusals, env), warnings: warnings}
}

// decodePodUses decodes the pod and finds its vGPU containers; a non-nil outcome ends the review.
func (r *Reviewer) decodePodUses(ctx context.Context, req *admissionv1.AdmissionRequest) (*corev1.Pod, []containerUse, *outcome) {
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return nil, nil, &outcome{err: fmt.Errorf("decode the pod: %w", err)}
	}
	uses, err := podUses(ctx, r.specs, r.rules.Selection, req.Namespace, &pod)
	if err != nil {
		var missing []Violation
		for _, e := range unjoin(err) {
			var m *MissingClaimError
			if !errors.As(e, &m) {
				return nil, nil, &outcome{err: err}
			}
			missing = append(missing, Violation{ReasonMissingClaim, m.Error()})
		}
		return nil, nil, &outcome{violations: missing}
	}
	return &pod, uses, nil
}

// validateClaim applies the capacity rules to a ResourceClaim, and the pod rules to the pods
// already admitted that will use it (recheck.go).
func (r *Reviewer) validateClaim(ctx context.Context, req *admissionv1.AdmissionRequest) outcome {
	var c resourceapi.ResourceClaim
	if err := json.Unmarshal(req.Object.Raw, &c); err != nil {
		return outcome{err: fmt.Errorf("decode the ResourceClaim: %w", err)}
	}
	vs := claimRules(&c.Spec, r.rules.Selection, "ResourceClaim "+objectName(req.Namespace, c.ObjectMeta), claimConfigPath)
	more, err := r.recheckPods(ctx, req.Namespace, &c)
	if err != nil {
		return outcome{err: fmt.Errorf("check the pods that will use ResourceClaim %s: %w", objectName(req.Namespace, c.ObjectMeta), err)}
	}
	return outcome{violations: append(vs, more...)}
}

// validateTemplate applies the capacity rules to a ResourceClaimTemplate.
func (r *Reviewer) validateTemplate(_ context.Context, req *admissionv1.AdmissionRequest) outcome {
	var t resourceapi.ResourceClaimTemplate
	if err := json.Unmarshal(req.Object.Raw, &t); err != nil {
		return outcome{err: fmt.Errorf("decode the ResourceClaimTemplate: %w", err)}
	}
	return outcome{violations: claimRules(&t.Spec.Spec, r.rules.Selection, "ResourceClaimTemplate "+objectName(req.Namespace, t.ObjectMeta), templateConfigPath)}
}

// objectName is "namespace/name" quoted, or the generateName prefix when the API server has
// not chosen the name yet.
func objectName(namespace string, m metav1.ObjectMeta) string {
	name := m.Name
	if name == "" {
		name = m.GenerateName + "…"
	}
	return fmt.Sprintf("%q", namespace+"/"+name)
}

// reasons lists the distinct reasons of the violations, for the log.
func reasons(vs []Violation) []string {
	var out []string
	for _, v := range vs {
		if !slices.Contains(out, v.Reason) {
			out = append(out, v.Reason)
		}
	}
	return out
}

// unjoin returns the errors an errors.Join combined, or err itself.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
