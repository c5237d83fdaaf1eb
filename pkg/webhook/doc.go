// Package webhook is vgpu-webhook, the admission webhook that guards vGPU pods (contract §12).
//
// The mutating webhook gives every container that uses a vGPU the required-plugins annotation
// for the kubelet plugin's NRI plugin, so that containerd refuses to create the container while
// that plugin is not registered (contract §1, §4). The validating webhook refuses, with a message
// that names the container, claim and request and says how to fix it, what the runtime, the
// library or the scheduler would otherwise refuse later or silently: a container with two vGPU
// claims, or with several vGPU requests that could land on one GPU (contract §3); contract
// variables in a vGPU container's env; capacity requests outside the published request policy
// (contract §2); a pod UPDATE that takes the required-plugins annotation away (guard.go); a
// second DeviceClass that could select the driver's devices (classes.go); optionally, the NVIDIA
// Container Toolkit's device variables in any container's env (toolkitenv.go).
//
// The parts, from the inside out:
//   - uses.go: which containers of a pod use a vGPU, and through which claims and requests;
//     the claims' and templates' specs come from Specs, which specs.go serves from informer caches;
//   - mutate.go and rules.go: the annotation patch and the refusals, pure functions of the
//     object and those specs;
//   - review.go: AdmissionReview in, rules, AdmissionReview out, with metrics and a log line;
//   - server.go: HTTPS with the certificate that tls.go keeps loaded (files that cert-manager or
//     the kubelet maintain, or a Secret that cert-controller's rotator maintains);
//   - webhook.go: Run builds those parts in order and reports readiness once the caches have
//     synced and a certificate is loaded.
package webhook
