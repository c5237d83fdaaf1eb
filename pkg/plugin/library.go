package plugin

import "github.com/vgpu-dra/vgpu-dra/pkg/contract"

// DefaultLibrarySource is where the plugin image carries libvgpu.so (contract §10).
const DefaultLibrarySource = contract.DefaultLibrarySource
