// Package integration runs the vgpu-kubelet-plugin in-process against the kubelet's real gRPC
// protocols: plugin registration (GetInfo, NotifyRegistrationStatus) and DRA v1
// (NodePrepareResources, NodeUnprepareResources) over unix sockets. The API server is a fake
// clientset and the GPUs are go-nvml mocks; everything on disk is real.
package integration
