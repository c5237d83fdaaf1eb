// Package toolkitconfig reads the settings of the NVIDIA Container Toolkit's config.toml that
// decide which containers can ask it for GPUs through NVIDIA_VISIBLE_DEVICES (contract §3,
// "env"). With --gpu-injection=env the kubelet plugin hands GPUs to vGPU containers through
// that variable, so the toolkit must honour it; when it honours it from unprivileged
// containers, it honours it from every container, also one without a claim that sets the
// variable itself (or runs an image that sets it, as CUDA images do with "all"). The plugin
// reads the file once at start-up and says so (pkg/plugin, toolkit.go).
//
// The file is TOML. No TOML library is among the module's dependencies, and only one top-level
// boolean key matters, so parse.go is a small scanner for the top level of a TOML document: it
// skips every other key's value, strings and arrays that span lines included, and stops at the
// first table header.
package toolkitconfig
