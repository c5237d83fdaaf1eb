package contract

import "time"

// Registry wire protocol (contract §5). The C client in library/src/registry_frame.h holds
// the same values; change both together.
const (
	// RegistryMagic opens every frame.
	RegistryMagic = "VGPR"
	// RegistryVersion is the only protocol version.
	RegistryVersion = 1
	// RegistryHeaderLen is magic(4) + version(1) + kind(1) + reserved(2) + length(4).
	RegistryHeaderLen = 12
	// RegistryMaxBody is the largest body length a frame may declare.
	RegistryMaxBody = 4096

	// Frame kinds.
	RegistryKindRequest  = 1
	RegistryKindResponse = 2

	// Request field tags.
	RegistryTagPodUID        = 1
	RegistryTagContainerName = 2
	RegistryTagRegisterUUID  = 3
	RegistryTagClientVersion = 4
	// RegistryMaxClientVersion bounds the client_version field (any bytes).
	RegistryMaxClientVersion = 64

	// Response field tags.
	RegistryTagMessage      = 1
	RegistryTagRetryAfterMS = 2
	// RegistryMaxMessage bounds the message field (UTF-8).
	RegistryMaxMessage = 1024
)

// Registry response statuses (contract §5).
const (
	RegistryStatusOK       = 0
	RegistryStatusRetry    = 1
	RegistryStatusNotFound = 2
	RegistryStatusDenied   = 3
	RegistryStatusInvalid  = 4
	RegistryStatusBusy     = 5
	RegistryStatusInternal = 6
)

// Registry server timing (contract §5).
const (
	// RegistryHeaderTimeout: the header must arrive within this time of accept.
	RegistryHeaderTimeout = 2 * time.Second
	// RegistryBodyTimeout: the body must arrive within this time after the header.
	RegistryBodyTimeout = 2 * time.Second
	// RegistryLinger: after a response the server discards input at most this long before closing.
	RegistryLinger = 100 * time.Millisecond
	// RegistryClientBudget: the client retries within this time from its first connect attempt.
	// It covers a plugin pod restart of normal length (contract §5 gives the measured figure),
	// during which the socket is missing or answers RETRY.
	RegistryClientBudget = 30 * time.Second
	// RegistryClientDefaultWait is the client's wait when no retry_after_ms came (or connect failed).
	RegistryClientDefaultWait = 100 * time.Millisecond
	// RegistryClientMinWait is the shortest wait the client makes between attempts.
	RegistryClientMinWait = 10 * time.Millisecond
)

// Host modes of the registry socket and its directory (contract §5). The directory is
// mounted read-only into every vGPU container: it must be traversable, not listable.
const (
	RegistryDirMode    = 0o711
	RegistrySocketMode = 0o666
	// PIDsConfigMode is pids.config's mode (contract §6), owned by root.
	PIDsConfigMode = 0o644
)
