package cluster

import (
	"encoding/json"
	"fmt"
	"hash/crc32"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/vgpu-dra/vgpu-dra/pkg/checkpoint"
)

// What the node holds about prepared claims, on the host: the plugin's checkpoint (contract §7)
// and the kubelet's own DRA state. The two must agree on every claim the kubelet believes
// prepared.
const (
	// PluginCheckpoint is the plugin's checkpoint under the chart's kubelet dir.
	PluginCheckpoint = "/var/lib/kubelet/plugins/" + DriverName + "/checkpoint.json"
	// KubeletDRAState is the kubelet's DRA manager checkpoint (its claim info cache).
	KubeletDRAState = "/var/lib/kubelet/dra_manager_state"
)

// KubeletClaim is one claim of our driver in the kubelet's DRA state.
type KubeletClaim struct {
	UID, Namespace, Name string
	// PodUIDs are the pods the kubelet holds the claim for, sorted.
	PodUIDs []string
	// Prepared says the kubelet recorded our driver's devices for the claim: NodePrepareResources
	// answered it. The kubelet records a claim before it calls Prepare and removes it after
	// Unprepare answered.
	Prepared bool
	// CDIDeviceIDs are the CDI devices of our driver's devices, sorted.
	CDIDeviceIDs []string
}

// ReadKubeletDRAState reads the kubelet's DRA checkpoint at path (checksum checked) and returns
// the claims that have results of our driver, by UID.
func ReadKubeletDRAState(path string) (map[string]KubeletClaim, error) {
	content, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the kubelet's DRA state: %w", err)
	}
	var outer struct {
		Data     *string
		Checksum uint32
	}
	if err := json.Unmarshal(content, &outer); err != nil || outer.Data == nil {
		return nil, fmt.Errorf("the kubelet's DRA state %s does not parse: %v", path, err)
	}
	if sum := crc32.ChecksumIEEE([]byte(*outer.Data)); sum != outer.Checksum {
		return nil, fmt.Errorf("the kubelet's DRA state %s: checksum %d, data hashes to %d", path, outer.Checksum, sum)
	}
	var data struct {
		ClaimInfoStateList []struct {
			ClaimUID, ClaimName, Namespace string
			PodUIDs                        map[string]struct{}
			DriverState                    map[string]struct {
				Devices []struct{ CDIDeviceIDs []string }
			}
		}
	}
	if err := json.Unmarshal([]byte(*outer.Data), &data); err != nil {
		return nil, fmt.Errorf("the kubelet's DRA state %s: data does not parse: %w", path, err)
	}
	out := map[string]KubeletClaim{}
	for _, c := range data.ClaimInfoStateList {
		state, ours := c.DriverState[DriverName]
		if !ours {
			continue
		}
		kc := KubeletClaim{UID: c.ClaimUID, Namespace: c.Namespace, Name: c.ClaimName,
			PodUIDs: slices.Sorted(maps.Keys(c.PodUIDs)), Prepared: len(state.Devices) > 0}
		for _, d := range state.Devices {
			kc.CDIDeviceIDs = append(kc.CDIDeviceIDs, d.CDIDeviceIDs...)
		}
		slices.Sort(kc.CDIDeviceIDs)
		if _, dup := out[kc.UID]; dup {
			return nil, fmt.Errorf("the kubelet's DRA state %s lists claim %s twice", path, kc.UID)
		}
		out[kc.UID] = kc
	}
	return out, nil
}

// Disagreements lists, claim by claim, where the plugin's checkpoint and the kubelet's DRA state
// contradict each other, or where either holds a claim twice:
//   - a claim in the checkpoint that the kubelet does not know (the kubelet records a claim before
//     it asks for Prepare and forgets it only after Unprepare answered: a leak);
//   - a claim the kubelet believes prepared that the checkpoint lacks or has not completed (lost),
//     or whose CDI devices differ;
//   - one claim name held under two UIDs, or one share of a device in two claims (duplicated).
//
// A claim the kubelet holds but has not seen prepared is in flux, not a disagreement. During a
// Prepare or an Unprepare a disagreement can last a moment; a caller decides how long one may
// last.
func Disagreements(plugin checkpoint.Data, kubelet map[string]KubeletClaim) []string {
	var out []string
	for _, uid := range slices.Sorted(maps.Keys(plugin.Claims)) {
		pc := plugin.Claims[uid]
		kc, known := kubelet[uid]
		switch {
		case !known:
			out = append(out, fmt.Sprintf("claim %s/%s (%s) is %s in the plugin's checkpoint but unknown to the kubelet", pc.Namespace, pc.Name, uid, pc.State))
		case kc.Namespace != pc.Namespace || kc.Name != pc.Name:
			out = append(out, fmt.Sprintf("claim %s is %s/%s in the plugin's checkpoint, %s/%s for the kubelet", uid, pc.Namespace, pc.Name, kc.Namespace, kc.Name))
		}
	}
	for _, uid := range slices.Sorted(maps.Keys(kubelet)) {
		kc := kubelet[uid]
		if !kc.Prepared {
			continue
		}
		pc, ok := plugin.Claims[uid]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("claim %s/%s (%s) is prepared for the kubelet but missing from the plugin's checkpoint", kc.Namespace, kc.Name, uid))
		case pc.State != checkpoint.PrepareCompleted:
			out = append(out, fmt.Sprintf("claim %s/%s (%s) is prepared for the kubelet but %s in the plugin's checkpoint", kc.Namespace, kc.Name, uid, pc.State))
		default:
			var ids []string
			for _, d := range pc.Devices {
				ids = append(ids, d.CDIDeviceIDs...)
			}
			slices.Sort(ids)
			if !slices.Equal(ids, kc.CDIDeviceIDs) {
				out = append(out, fmt.Sprintf("claim %s/%s (%s): the kubelet has CDI devices [%s], the plugin's checkpoint [%s]",
					kc.Namespace, kc.Name, uid, strings.Join(kc.CDIDeviceIDs, " "), strings.Join(ids, " ")))
			}
		}
	}
	return append(out, duplicates(plugin, kubelet)...)
}

// duplicates lists claim names held under two UIDs (by the plugin or the kubelet) and device
// shares held by two claims of the plugin.
func duplicates(plugin checkpoint.Data, kubelet map[string]KubeletClaim) []string {
	var out []string
	names := map[string]string{}
	shares := map[string]string{}
	for _, uid := range slices.Sorted(maps.Keys(plugin.Claims)) {
		pc := plugin.Claims[uid]
		name := pc.Namespace + "/" + pc.Name
		if other, dup := names[name]; dup {
			out = append(out, fmt.Sprintf("claim %s is in the plugin's checkpoint twice: %s and %s", name, other, uid))
		}
		names[name] = uid
		for _, d := range pc.Devices {
			share := d.Pool + "/" + d.Device + "/" + d.ShareID
			if other, dup := shares[share]; dup && other != uid {
				out = append(out, fmt.Sprintf("share %s is in claims %s and %s of the plugin's checkpoint", share, other, uid))
			}
			shares[share] = uid
		}
	}
	clear(names)
	for _, uid := range slices.Sorted(maps.Keys(kubelet)) {
		kc := kubelet[uid]
		name := kc.Namespace + "/" + kc.Name
		if other, dup := names[name]; dup {
			out = append(out, fmt.Sprintf("claim %s is in the kubelet's DRA state twice: %s and %s", name, other, uid))
		}
		names[name] = uid
	}
	return out
}
