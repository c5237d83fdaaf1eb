package checkpoint

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
)

// claimEncoder encodes the data value of the file the way json.Marshal does (keys sorted,
// the same bytes), but keeps each claim's encoding and encodes only the claims that changed
// since the last write. Every Prepare writes the whole checkpoint, and encoding all of it took
// 0.57 ms with 300 claims prepared and 1.6 ms with 800 on the machines this is measured on: more
// than the fsync, growing with the node's claims (issue 18). A claim's record is small and
// compared field by field against the one encoded before.
//
// Only the leader of a batch encodes (Store.persist), so it needs no lock.
type claimEncoder struct {
	claims map[string]encodedClaim
	buf    bytes.Buffer
}

type encodedClaim struct {
	claim Claim // as encoded: a record of the store's state, which never changes (cow.go)
	json  []byte
}

func newClaimEncoder() *claimEncoder {
	return &claimEncoder{claims: map[string]encodedClaim{}}
}

// encode returns the data value of d, byte for byte what json.Marshal(d) returns. The bytes
// are the encoder's buffer: valid until the next encode (the file is assembled from them).
func (e *claimEncoder) encode(d Data) ([]byte, error) {
	uids := make([]string, 0, len(d.Claims))
	for uid := range d.Claims {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	e.buf.Reset()
	e.buf.WriteString(`{"bootID":`)
	if err := appendJSON(&e.buf, d.BootID); err != nil {
		return nil, err
	}
	e.buf.WriteString(`,"claims":{`)
	for i, uid := range uids {
		c := d.Claims[uid]
		enc, ok := e.claims[uid]
		if !ok || !c.equal(enc.claim) {
			b, err := json.Marshal(c)
			if err != nil {
				return nil, fmt.Errorf("encode claim %s: %w", uid, err)
			}
			enc = encodedClaim{claim: c, json: b}
			e.claims[uid] = enc
		}
		if i > 0 {
			e.buf.WriteByte(',')
		}
		if err := appendJSON(&e.buf, uid); err != nil {
			return nil, err
		}
		e.buf.WriteByte(':')
		e.buf.Write(enc.json)
	}
	e.buf.WriteString(`}}`)
	for uid := range e.claims {
		if _, ok := d.Claims[uid]; !ok {
			delete(e.claims, uid)
		}
	}
	return e.buf.Bytes(), nil
}

// appendJSON appends v as encoding/json encodes it: quoted as it is when it holds only
// printable ASCII that encoding/json leaves alone (claim UIDs, boot IDs), else by json.Marshal.
func appendJSON(buf *bytes.Buffer, v string) error {
	plain := true
	for i := 0; i < len(v) && plain; i++ {
		c := v[i]
		plain = c >= 0x20 && c < 0x7f && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	if plain {
		buf.WriteByte('"')
		buf.WriteString(v)
		buf.WriteByte('"')
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	buf.Write(b)
	return nil
}

// equal reports whether c and o are the same record.
func (c Claim) equal(o Claim) bool {
	if c.Namespace != o.Namespace || c.Name != o.Name || c.State != o.State || c.Path != o.Path ||
		c.RegisterUUID != o.RegisterUUID || !nilEqual(c.ReservedFor, o.ReservedFor) || (c.Devices == nil) != (o.Devices == nil) ||
		len(c.Devices) != len(o.Devices) {
		return false
	}
	for i := range c.Devices {
		a, b := c.Devices[i], o.Devices[i]
		if a.Request != b.Request || a.Pool != b.Pool || a.Device != b.Device || a.ShareID != b.ShareID ||
			a.GPUUUID != b.GPUUUID || a.Index != b.Index || a.MemoryBytes != b.MemoryBytes || a.Cores != b.Cores ||
			a.AdminAccess != b.AdminAccess || a.Class != b.Class || a.CoresCeiling != b.CoresCeiling || a.MIG != b.MIG || !nilEqual(a.CDIDeviceIDs, b.CDIDeviceIDs) {
			return false
		}
	}
	return true
}

// nilEqual is slices.Equal that also tells nil from empty: they encode differently.
func nilEqual(a, b []string) bool {
	return (a == nil) == (b == nil) && slices.Equal(a, b)
}
