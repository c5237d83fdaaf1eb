// Package handover lets a new plugin instance take a node over from the running one while pods
// keep starting (contract §14; the "Upgrades" section of architecture.md). It is the protocol
// and its parts, not the plugin: pkg/plugin implements Owner and Successor over the real
// checkpoint, NRI plugin, registry and kubelet services.
//
// One instance owns the node at a time: the one holding the instance lock (pkg/instancelock).
// The owner listens on the handover socket in the kubelet plugin data directory and writes a
// Record into the lock file. Another instance (a surge pod of a rolling update) is an observer:
// it dials the owner, says Hello, registers with NRI one index after the owner, follows what the
// runtime tells it without deciding anything, and when ready asks for the node:
//
//	successor                         owner
//	hello{pod}                 →
//	                           ←      welcome{nriIndex} (markers on)
//	takeover                   →
//	                                  fence: hold new kubelet calls and CreateContainers, wait
//	                                  for those in flight, seal the checkpoint
//	                           ←      fenced
//	load the checkpoint (can it read it?)
//	commit                     →      (or abort: the owner unfences and serves on)
//	                                  stop the owner-only parts, release the lock (T)
//	                           ←      released
//	take the lock, open the checkpoint, build the owner's parts
//	took{draSocket}            →      held calls pass: NRI answers nothing (the new owner,
//	                                  called next, adjusts), the kubelet's are forwarded
//	                           ←      report{pause}
//
// Whoever holds the lock owns, at every moment: a crash before T leaves the old owner holding
// it (the fence is lifted when the connection drops); a crash of the old owner at any step
// frees the lock, which the observer takes (TryAcquire on every call it sees and every 100 ms);
// a crash of the new owner after T frees it again and the old instance, now an observer, takes
// it back the same way.
package handover
