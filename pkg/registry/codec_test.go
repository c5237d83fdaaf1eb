package registry

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"
)

const (
	podA  = "0b5a1c2d-3e4f-4a5b-8c6d-7e8f9a0b1c2d"
	podB  = "1c6b2d3e-4f5a-4b6c-9d7e-8f9a0b1c2d3e"
	uuidR = "2d7c3e4f-5a6b-4c7d-ae8f-9a0b1c2d3e4f"
)

// frame builds a frame by hand so tests can break any rule.
func frame(kind uint8, body []byte) []byte {
	b := []byte("VGPR")
	b = append(b, 1, kind, 0, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)))
	return append(b, body...)
}

func fld(tag uint8, v string) []byte {
	b := []byte{tag}
	b = binary.BigEndian.AppendUint16(b, uint16(len(v)))
	return append(b, v...)
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func TestParseHeader(t *testing.T) {
	good := frame(1, nil)
	cases := []struct {
		name  string
		mut   func([]byte) []byte
		valid bool
	}{
		{"good", func(b []byte) []byte { return b }, true},
		{"short", func(b []byte) []byte { return b[:11] }, false},
		{"magic", func(b []byte) []byte { b[0] = 'X'; return b }, false},
		{"magic lower-case", func(b []byte) []byte { copy(b, "vgpr"); return b }, false},
		{"version 0", func(b []byte) []byte { b[4] = 0; return b }, false},
		{"version 2", func(b []byte) []byte { b[4] = 2; return b }, false},
		{"reserved high", func(b []byte) []byte { b[6] = 1; return b }, false},
		{"reserved low", func(b []byte) []byte { b[7] = 1; return b }, false},
		{"length 4096", func(b []byte) []byte { binary.BigEndian.PutUint32(b[8:], 4096); return b }, true},
		{"length 4097", func(b []byte) []byte { binary.BigEndian.PutUint32(b[8:], 4097); return b }, false},
		{"length huge", func(b []byte) []byte { binary.BigEndian.PutUint32(b[8:], 0xffffffff); return b }, false},
		{"any kind passes the header", func(b []byte) []byte { b[5] = 9; return b }, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := c.mut(append([]byte(nil), good...))
			_, err := ParseHeader(b)
			if c.valid != (err == nil) {
				t.Fatalf("valid=%v, err=%v", c.valid, err)
			}
			if err != nil && !errors.Is(err, ErrInvalidFrame) {
				t.Fatalf("error %v is not ErrInvalidFrame", err)
			}
		})
	}
}

func TestParseRequest(t *testing.T) {
	nri := cat(fld(1, podA), fld(2, "app"))
	cases := []struct {
		name string
		body []byte
		want Request
		ok   bool
	}{
		{"NRI path", nri, Request{PodUID: podA, ContainerName: "app"}, true},
		{"NRI path, fields reversed", cat(fld(2, "app"), fld(1, podA)), Request{PodUID: podA, ContainerName: "app"}, true},
		{"NRI path with version", cat(nri, fld(4, "libvgpu/1.0")), Request{PodUID: podA, ContainerName: "app", ClientVersion: "libvgpu/1.0"}, true},
		{"NRI path, empty tag 3", cat(nri, fld(3, "")), Request{PodUID: podA, ContainerName: "app"}, true},
		{"unknown tags skipped", cat(fld(9, "x"), nri, fld(255, strings.Repeat("z", 300)), fld(0, "")), Request{PodUID: podA, ContainerName: "app"}, true},
		{"per-claim path", fld(3, uuidR), Request{RegisterUUID: uuidR}, true},
		{"per-claim path with identity", cat(fld(3, uuidR), fld(1, podA), fld(2, "app")), Request{RegisterUUID: uuidR, PodUID: podA, ContainerName: "app"}, true},
		{"per-claim path, empty identity", cat(fld(3, uuidR), fld(1, ""), fld(2, "")), Request{RegisterUUID: uuidR}, true},
		{"version of 64 bytes", cat(nri, fld(4, strings.Repeat("\xff", 64))), Request{PodUID: podA, ContainerName: "app", ClientVersion: strings.Repeat("\xff", 64)}, true},
		{"container name of 63", cat(fld(1, podA), fld(2, strings.Repeat("a", 63))), Request{PodUID: podA, ContainerName: strings.Repeat("a", 63)}, true},

		{"empty body", nil, Request{}, false},
		{"pod only", fld(1, podA), Request{}, false},
		{"name only", fld(2, "app"), Request{}, false},
		{"empty pod", cat(fld(1, ""), fld(2, "app")), Request{}, false},
		{"repeated pod", cat(nri, fld(1, podA)), Request{}, false},
		{"repeated unknown tag", cat(nri, fld(7, ""), fld(7, "")), Request{}, false},
		{"repeated empty tag 3", cat(nri, fld(3, ""), fld(3, "")), Request{}, false},
		{"truncated field header", cat(nri, []byte{4, 0}), Request{}, false},
		{"one stray byte", cat(nri, []byte{4}), Request{}, false},
		{"field longer than body", cat(nri, []byte{4, 0, 10}, []byte("abc")), Request{}, false},
		{"field length 65535", cat(nri, []byte{4, 0xff, 0xff}), Request{}, false},
		{"upper-case pod", cat(fld(1, strings.ToUpper(podA)), fld(2, "app")), Request{}, false},
		{"braced pod", cat(fld(1, "{"+podA[:34]+"}"), fld(2, "app")), Request{}, false},
		{"pod without dashes", cat(fld(1, strings.ReplaceAll(podA, "-", "")), fld(2, "app")), Request{}, false},
		{"pod too long", cat(fld(1, podA+"0"), fld(2, "app")), Request{}, false},
		{"pod non-hex", cat(fld(1, "g"+podA[1:]), fld(2, "app")), Request{}, false},
		{"name upper-case", cat(fld(1, podA), fld(2, "App")), Request{}, false},
		{"name with underscore", cat(fld(1, podA), fld(2, "a_b")), Request{}, false},
		{"name with slash", cat(fld(1, podA), fld(2, "../x")), Request{}, false},
		{"name leading dash", cat(fld(1, podA), fld(2, "-a")), Request{}, false},
		{"name trailing dash", cat(fld(1, podA), fld(2, "a-")), Request{}, false},
		{"name of 64", cat(fld(1, podA), fld(2, strings.Repeat("a", 64))), Request{}, false},
		{"name with NUL", cat(fld(1, podA), fld(2, "a\x00")), Request{}, false},
		{"upper-case register uuid", fld(3, strings.ToUpper(uuidR)), Request{}, false},
		{"bad register uuid", fld(3, "not-a-uuid"), Request{}, false},
		{"per-claim, bad pod", cat(fld(3, uuidR), fld(1, "x")), Request{}, false},
		{"per-claim, bad name", cat(fld(3, uuidR), fld(2, "X")), Request{}, false},
		{"version of 65 bytes", cat(nri, fld(4, strings.Repeat("v", 65))), Request{}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseRequest(c.body)
			if c.ok != (err == nil) {
				t.Fatalf("ok=%v, err=%v", c.ok, err)
			}
			if err != nil {
				if !errors.Is(err, ErrInvalidFrame) {
					t.Fatalf("error %v is not ErrInvalidFrame", err)
				}
				return
			}
			if got != c.want {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestParseResponse(t *testing.T) {
	st := func(s Status) []byte { return binary.BigEndian.AppendUint16(nil, uint16(s)) }
	ms := func(v uint32) string { return string(binary.BigEndian.AppendUint32(nil, v)) }
	cases := []struct {
		name string
		body []byte
		want Response
		ok   bool
	}{
		{"bare OK", st(StatusOK), Response{Status: StatusOK}, true},
		{"busy", cat(st(StatusBusy), fld(2, ms(250)), fld(1, "busy")), Response{Status: StatusBusy, Message: "busy", RetryAfter: 250 * time.Millisecond, HasRetryAfter: true}, true},
		{"unknown status kept", st(42), Response{Status: 42}, true},
		{"unknown tag", cat(st(StatusOK), fld(9, "x")), Response{Status: StatusOK}, true},
		{"message of 1024", cat(st(StatusDenied), fld(1, strings.Repeat("m", 1024))), Response{Status: StatusDenied, Message: strings.Repeat("m", 1024)}, true},
		{"empty", nil, Response{}, false},
		{"one byte", []byte{0}, Response{}, false},
		{"message of 1025", cat(st(StatusDenied), fld(1, strings.Repeat("m", 1025))), Response{}, false},
		{"message not UTF-8", cat(st(StatusDenied), fld(1, "\xff\xfe")), Response{}, false},
		{"retry_after of 2 bytes", cat(st(StatusRetry), fld(2, "ab")), Response{}, false},
		{"repeated message", cat(st(StatusOK), fld(1, "a"), fld(1, "b")), Response{}, false},
		{"truncated field", cat(st(StatusOK), []byte{1, 0, 5, 'a'}), Response{}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseResponse(c.body)
			if c.ok != (err == nil) {
				t.Fatalf("ok=%v, err=%v", c.ok, err)
			}
			if err == nil && got != c.want {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestParseFrame(t *testing.T) {
	req := frame(1, cat(fld(1, podA), fld(2, "app")))
	cases := []struct {
		name string
		b    []byte
		ok   bool
	}{
		{"request", req, true},
		{"trailing bytes ignored", cat(req, []byte("garbage after the frame")), true},
		{"response", frame(2, []byte{0, 0}), true},
		{"truncated body", req[:len(req)-1], false},
		{"header only", req[:12], false},
		{"kind 0", frame(0, cat(fld(1, podA), fld(2, "app"))), false},
		{"kind 3", frame(3, nil), false},
		{"declared length shorter than the fields", func() []byte {
			b := append([]byte(nil), req...)
			binary.BigEndian.PutUint32(b[8:], uint32(len(req)-12-1))
			return b
		}(), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := ParseFrame(c.b)
			if c.ok != (err == nil) {
				t.Fatalf("ok=%v, err=%v", c.ok, err)
			}
		})
	}
}

func TestRequestRoundTrip(t *testing.T) {
	for _, r := range []Request{
		{PodUID: podA, ContainerName: "app"},
		{PodUID: podA, ContainerName: "app", ClientVersion: "libvgpu/0.1"},
		{RegisterUUID: uuidR},
		{RegisterUUID: uuidR, PodUID: podB, ContainerName: "c-1"},
	} {
		b, err := AppendRequest(nil, r)
		if err != nil {
			t.Fatalf("encode %+v: %v", r, err)
		}
		h, got, err := ParseFrame(b)
		if err != nil || h.Kind != 1 || got != r {
			t.Fatalf("round trip of %+v: %+v, %v", r, got, err)
		}
	}
	for _, r := range []Request{{}, {PodUID: podA}, {PodUID: "bad", ContainerName: "app"}, {RegisterUUID: uuidR, ClientVersion: strings.Repeat("v", 65)}} {
		if _, err := AppendRequest(nil, r); err == nil {
			t.Errorf("encoded invalid request %+v", r)
		}
	}
}

// TestRequestBytes pins the exact bytes, the same ones library/src/registry_frame.c emits
// (header, then tags 1, 2, 3, 4 in that order, empty fields omitted).
func TestRequestBytes(t *testing.T) {
	b, err := AppendRequest(nil, Request{PodUID: podA, ContainerName: "app", ClientVersion: "v"})
	if err != nil {
		t.Fatal(err)
	}
	want := cat([]byte("VGPR"), []byte{1, 1, 0, 0, 0, 0, 0, byte(3 + 36 + 3 + 3 + 3 + 1)},
		[]byte{1, 0, 36}, []byte(podA), []byte{2, 0, 3}, []byte("app"), []byte{4, 0, 1}, []byte("v"))
	if !bytes.Equal(b, want) {
		t.Fatalf("got  %x\nwant %x", b, want)
	}
}

func TestResponseEncoding(t *testing.T) {
	b := AppendResponse(nil, Response{Status: StatusRetry, Message: "wait", RetryAfter: 100 * time.Millisecond, HasRetryAfter: true})
	want := cat([]byte("VGPR"), []byte{1, 2, 0, 0, 0, 0, 0, 2 + 7 + 7}, []byte{0, 1},
		[]byte{1, 0, 4}, []byte("wait"), []byte{2, 0, 4, 0, 0, 0, 100})
	if !bytes.Equal(b, want) {
		t.Fatalf("got  %x\nwant %x", b, want)
	}
	// Long and broken messages are clipped to valid UTF-8 of at most 1024 bytes.
	for _, msg := range []string{strings.Repeat("é", 600), strings.Repeat("x", 2000), "bad \xff byte"} {
		b := AppendResponse(nil, Response{Status: StatusInternal, Message: msg})
		_, r, err := ParseFrame(b)
		if err != nil {
			t.Fatalf("message %.20q: %v", msg, err)
		}
		if m := r.(Response).Message; len(m) > 1024 || !strings.HasPrefix(msg, m[:min(len(m), 4)]) && !strings.Contains(m, "\uFFFD") {
			t.Fatalf("clipped message %.20q", m)
		}
	}
	if s := Status(9).String(); s != "STATUS_9" {
		t.Fatal(s)
	}
}
