package registry

import (
	"errors"
	"testing"

	"github.com/vgpu-dra/vgpu-dra/pkg/contract"
)

// FuzzParseFrame drives the frame parser with arbitrary bytes. Seeds are in
// testdata/fuzz/FuzzParseFrame (run in every `go test`); CI runs it bounded with
//
//	go test ./pkg/registry -run '^$' -fuzz '^FuzzParseFrame$' -fuzztime 30s
//
// Properties: no panic; every error is an ErrInvalidFrame; no accepted length exceeds 4096;
// a frame that parses re-encodes to bytes that parse to the same value.
func FuzzParseFrame(f *testing.F) {
	for _, s := range [][]byte{
		frame(1, cat(fld(1, podA), fld(2, "app"))),
		frame(1, cat(fld(3, uuidR), fld(4, "libvgpu/1"))),
		frame(2, cat([]byte{0, 5}, fld(2, "\x00\x00\x00\x0a"), fld(1, "busy"))),
		frame(1, cat(fld(1, podA), fld(1, podA))),
		frame(1, []byte{1, 0xff, 0xff}),
		[]byte("VGPR\x01\x01\x00\x00\xff\xff\xff\xff"),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, v, err := ParseFrame(b)
		if err != nil {
			if !errors.Is(err, ErrInvalidFrame) {
				t.Fatalf("error %v is not ErrInvalidFrame", err)
			}
			return
		}
		if h.Length > contract.RegistryMaxBody {
			t.Fatalf("accepted length %d", h.Length)
		}
		switch r := v.(type) {
		case Request:
			out, err := AppendRequest(nil, r)
			if err != nil {
				t.Fatalf("parsed request %+v does not encode: %v", r, err)
			}
			_, again, err := ParseFrame(out)
			if err != nil || again != r {
				t.Fatalf("round trip of %+v: %+v, %v", r, again, err)
			}
		case Response:
			out := AppendResponse(nil, r)
			_, again, err := ParseFrame(out)
			if err != nil || again != r {
				t.Fatalf("round trip of %+v: %+v, %v", r, again, err)
			}
		default:
			t.Fatalf("parsed a frame of kind %d into %T", h.Kind, v)
		}
	})
}
