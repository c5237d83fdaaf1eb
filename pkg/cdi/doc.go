// Package cdi builds and writes the per-claim transient CDI spec of contract §3
// (docs/design/contract.md): one spec file per prepared claim, kind "<driver>/claim", with one
// CDI device per allocation result (the GPU's UUID and limits) and one claim-common device
// (identity env, neutralised image env, and the library, registry and per-claim bind mounts).
//
// The spec is built from the CDI library's own types (tags.cncf.io/container-device-interface),
// and checked by the library's own validators before it is written (libcheck.go), so what the
// runtime reads is what the library accepts.
//
// Why no CDI cache: the library's Cache with auto-refresh re-reads and parses every spec in the
// directory on each write or removal, which turns a burst of n claims into O(n²) work
// (docs/performance.md). A Writer only writes and removes its own files; each operation
// touches one file and is O(1) in the number of specs in the directory.
package cdi
