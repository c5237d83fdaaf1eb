// Package podevents raises the node-side enforcer's Warning events on pods (contract §15), for
// both plugins: the kubelet plugin's enforcer and the device plugin's.
package podevents

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/vgpu-dra/vgpu-dra/pkg/enforce"
)

// Component is the enforcer's events' source component.
const Component = "vgpu-dra-enforcer"

// PluginComponent is the source component of the kubelet plugin's own Warning events on pods
// (the reconciliation's, contract §7): not the enforcer's, so that a check of the enforcer's
// actions does not count them.
const PluginComponent = "vgpu-dra-kubelet-plugin"

// Recorder raises the events through an event broadcaster: it aggregates repeats and never
// blocks the enforcer.
type Recorder struct {
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
}

// New starts a broadcaster that writes the enforcer's events on node's pods to the API server.
func New(kube kubernetes.Interface, node string) *Recorder { return NewFor(kube, node, Component) }

// NewFor is New with another source component.
func NewFor(kube kubernetes.Interface, node, component string) *Recorder {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	return &Recorder{broadcaster: b, recorder: b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component, Host: node})}
}

// Warn raises a Warning event on the target's pod (enforce.Deps.Event). A target without a
// pod known by name and UID (a per-claim claim) gets none.
func (r *Recorder) Warn(t enforce.Target, reason, message string) {
	r.WarnPod(t.Namespace, t.Pod, t.PodUID, reason, message)
}

// WarnPod raises a Warning event on the pod; none without its name and UID.
func (r *Recorder) WarnPod(namespace, pod, podUID, reason, message string) {
	r.PodEvent(namespace, pod, podUID, corev1.EventTypeWarning, reason, message)
}

// PodEvent raises an event of eventType (corev1.EventTypeWarning or EventTypeNormal) on the
// pod; none without its name and UID.
func (r *Recorder) PodEvent(namespace, pod, podUID, eventType, reason, message string) {
	if podUID == "" || pod == "" {
		return
	}
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: namespace, Name: pod, UID: types.UID(podUID)}
	r.recorder.Event(ref, eventType, reason, message)
}

// Shutdown stops the broadcaster.
func (r *Recorder) Shutdown() { r.broadcaster.Shutdown() }
