package deviceplugin

import (
	"context"
	"fmt"
	"slices"

	"google.golang.org/grpc"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/vgpu-dra/vgpu-dra/pkg/claimdir"
	"github.com/vgpu-dra/vgpu-dra/pkg/registry"
)

// PodResources is the part of the kubelet's pod-resources API the plugin asks: which
// container holds which devices (podresourcesapi.PodResourcesListerClient satisfies it).
type PodResources interface {
	List(ctx context.Context, in *podresourcesapi.ListPodResourcesRequest, opts ...grpc.CallOption) (*podresourcesapi.ListPodResourcesResponse, error)
}

// podRef names a pod as the pod-resources API does.
type podRef struct{ namespace, name string }

// heldSet is the device IDs of our resource that one container holds.
type heldSet struct {
	pod       podRef
	container string
	ids       []string
}

// holders answers who holds a share, from the kubelet (pod-resources: pod names and their
// containers' device IDs) and the API server (a pod's UID by name): the kubelet assigns device
// IDs to containers and is the only record of it; Allocate itself carries no pod.
type holders struct {
	kubelet  PodResources
	kube     kubernetes.Interface
	resource string
	// answers bounds what registrations cost the kubelet and the API server (holdercache.go).
	answers holderAnswers
}

// list asks the kubelet for every pod's devices.
func (h *holders) list(ctx context.Context) (*podresourcesapi.ListPodResourcesResponse, error) {
	h.answers.lists.Add(1)
	resp, err := h.kubelet.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("list pod resources from the kubelet: %w", err)
	}
	return resp, nil
}

// heldSets lists, per container, the device IDs of our resource it holds.
func (h *holders) heldSets(resp *podresourcesapi.ListPodResourcesResponse) []heldSet {
	var out []heldSet
	for _, p := range resp.GetPodResources() {
		for _, c := range p.GetContainers() {
			var ids []string
			for _, d := range c.GetDevices() {
				if d.GetResourceName() == h.resource {
					ids = append(ids, d.GetDeviceIds()...)
				}
			}
			if len(ids) > 0 {
				out = append(out, heldSet{pod: podRef{p.GetNamespace(), p.GetName()}, container: c.GetName(), ids: ids})
			}
		}
	}
	return out
}

// held lists, per container, the device IDs of our resource it holds.
func (h *holders) held(ctx context.Context) ([]heldSet, error) {
	resp, err := h.list(ctx)
	if err != nil {
		return nil, err
	}
	return h.heldSets(resp), nil
}

// verify decides whether the pod with UID podUID holds the share with device ID shareID now
// (registry.HolderCheck; contract §13). The kubelet says which pod, by namespace and name,
// holds the share; the API server says which UID that name has. The API has at most one pod
// of a name at a time, but the kubelet may for a moment run two — a force-deleted pod still
// stopping and its replacement: when it lists the name twice, no one can tell which holds the
// share, and the answer is no.
func (h *holders) verify(ctx context.Context, shareID, podUID string) error {
	asked := h.answers.clock()
	if ok, err := h.answers.cached(shareID, podUID, asked); ok {
		return err
	}
	resp, err := h.answers.listSince(ctx, asked, h.list)
	if err != nil {
		return err
	}
	err = h.decide(ctx, resp, shareID, podUID)
	h.answers.record(shareID, podUID, err)
	return err
}

// decide is verify's answer from one pod-resources list.
func (h *holders) decide(ctx context.Context, resp *podresourcesapi.ListPodResourcesResponse, shareID, podUID string) error {
	var holder *podRef
	for _, s := range h.heldSets(resp) {
		if !slices.Contains(s.ids, shareID) {
			continue
		}
		if holder != nil && *holder != s.pod {
			return fmt.Errorf("share %s is listed for pods %s/%s and %s/%s: %w", shareID, holder.namespace, holder.name, s.pod.namespace, s.pod.name, registry.ErrNotHolder)
		}
		holder = &s.pod
	}
	if holder == nil {
		return fmt.Errorf("share %s is not allocated to any container on this node: %w", shareID, registry.ErrNotHolder)
	}
	named := 0
	for _, p := range resp.GetPodResources() {
		if p.GetNamespace() == holder.namespace && p.GetName() == holder.name {
			named++
		}
	}
	if named > 1 {
		return fmt.Errorf("the kubelet runs %d pods named %s/%s: %w", named, holder.namespace, holder.name, registry.ErrNotHolder)
	}
	h.answers.gets.Add(1)
	pod, err := h.kube.CoreV1().Pods(holder.namespace).Get(ctx, holder.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("share %s is held by pod %s/%s, which the API server no longer has: %w", shareID, holder.namespace, holder.name, registry.ErrNotHolder)
	case err != nil:
		return fmt.Errorf("read pod %s/%s: %w", holder.namespace, holder.name, err)
	case string(pod.UID) != podUID:
		return fmt.Errorf("share %s is held by pod %s/%s (%s), not by the caller's pod %s: %w", shareID, holder.namespace, holder.name, pod.UID, podUID, registry.ErrNotHolder)
	}
	return nil
}

// shareTargets is the registry's ClaimResolver over the shares: a register UUID is a share's
// UID (the lead of the container that holds it), its config directory the share's, and the
// holder check asks the kubelet (verify).
type shareTargets struct {
	inv     *Inventory
	layout  claimdir.Layout
	holders *holders
}

// ClaimByRegisterUUID resolves a share by its UID. It does not ask the kubelet: the registry
// also calls it to prune, every second; the holder is checked at registration only.
func (t shareTargets) ClaimByRegisterUUID(uuid string) (registry.Claim, bool) {
	sh, ok := t.inv.ByUID(uuid)
	if !ok {
		return registry.Claim{}, false
	}
	dirs, err := t.layout.PerClaimDirs(sh.UID)
	if err != nil {
		return registry.Claim{}, false
	}
	id := sh.ID
	return registry.Claim{UID: sh.UID, ConfigDir: dirs.Config, VerifyHolder: func(ctx context.Context, podUID string) error {
		return t.holders.verify(ctx, id, podUID)
	}}, true
}
