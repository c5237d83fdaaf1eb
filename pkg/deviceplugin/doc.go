// Package deviceplugin is vgpu-device-plugin: the same enforced GPU shares as the DRA path,
// offered through the kubelet's device-plugin API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1)
// as an extended resource, for clusters and workloads that schedule GPUs with
// resources.limits (contract §13, docs/design/contract.md).
//
// Each GPU is cut into a fixed number of shares of equal size (Inventory); a share is one
// device of the resource, ID "<GPU UUID>::<n>". The kubelet picks the device IDs of a
// container (GetPreferredAllocation advises: binpack or spread) and calls Allocate, which
// validates them, merges the container's shares per GPU, resets the directory set of the
// container's lead share (its first) on a tmpfs of its own, writes its vgpu.config, and
// answers the lead's CDI device (one spec for all shares, written at start-up) and the env of
// contract §3. The library registers with the lead's UID; the registry lets only the pod that
// the kubelet's pod-resources API says holds the share register for it.
//
// The parts, each in its own file: shares.go (the inventory and device IDs), preferred.go
// (GetPreferredAllocation), allocate.go (Allocate and the directory sets), devices.go (health
// and ListAndWatch's broadcast), server.go (the gRPC service), registration.go (serve, then
// register; kept across kubelet restarts by one watcher), holders.go (who holds a share, for
// the registry), keeper.go (directory sets rebuilt after a reboot, removed when no longer
// held), enforce.go and enforce_targets.go (the node-side enforcer over the pods that hold
// shares, contract §15), labels.go (share sizes on the node), debug.go and start.go (the
// composition root).
package deviceplugin
